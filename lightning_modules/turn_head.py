"""``TurnHead``: thin LightningModule around a ``models.heads`` head on cached causal features.

Outputs per row: 10 logits for the binary targets of ``algorithms.turn_targets.target_names()`` (voice activity and
VAP future bins of wearer/others) + 1 shift-vs-hold logit (trained only at event rows). Loss: masked BCE over the
10 targets (mean over counted entries) + ``shift_loss_weight`` x BCE at shift/hold event rows.

Metrics (torchmetrics, ``val/`` and ``test/`` prefixes): per target ``auroc_<name>`` and ``ap_<name>`` (average
precision; one ``MetricCollection`` of ``MultilabelAUROC`` / ``MultilabelAveragePrecision``, ``average=None``,
``ignore_index=-1``; a target with no counted row is NaN), their means ``auroc_mean`` / ``ap_mean``; at shift/hold events ``sh_bacc`` (balanced accuracy = macro
recall over {hold, shift}), ``sh_f1w`` (F1 weighted by class support, the "S/H weighted F1" of Ekstedt & Skantze,
VAP, Interspeech 2022) with the shift probability thresholded at 0.5, and ``sh_auroc``. Training logs ``train/loss`` (the epoch's mean
step loss, once per epoch), ``train/loss_step`` (every ``log_every_n_steps``, progress bar),
``train/epoch_time_s`` and ``train/rows_per_s`` (counted rows per second of the epoch's training steps, forward + backward +
optimizer, validation excluded). At test end, PR curves of
every target go to W&B when a ``WandbLogger`` is attached (:class:`BinnedMultilabelPrecisionRecallCurve`: 101 fixed
thresholds, updated per step: state of 10 x 101 x 4 counters whatever the test set's size, and an update's memory
bounded by ``chunk_rows`` x 10 x 101 booleans whether ``trainer.deterministic`` is on or off).

The head is built from ``head_type`` etc. (flat arguments, so W&B sweeps can vary them); ``in_dim`` (D) defaults to
the datamodule's ``feature_dim`` at ``setup`` and is then stored in the hyperparameters, so checkpoints reload; a
head whose D differs from the datamodule's (a checkpoint of other features) fails at the start of fit / validate /
test, naming both sizes, the checkpoint and the features folder.
"""
from __future__ import annotations

import math
import time
from typing import Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torchmetrics import MetricCollection
from torchmetrics.classification import (BinaryAUROC, MulticlassF1Score, MulticlassRecall, MultilabelAUROC,
                                         MultilabelAveragePrecision, MultilabelPrecisionRecallCurve)
from torchmetrics.functional.classification import binary_auroc, binary_average_precision
from torchmetrics.functional.classification.precision_recall_curve import (
    _multilabel_precision_recall_curve_format, _multilabel_precision_recall_curve_tensor_validation)
from torchmetrics.utilities.data import dim_zero_cat

from algorithms.errors import SettingError, check_int
from algorithms.turn_targets import NUM_TARGETS, target_names
from models.heads import HEAD_TYPES, build_head

HeadType = Literal["linear", "mlp", "causal_conv", "causal_attention"]   # = models.heads.HEAD_TYPES
PR_THRESHOLDS = 101


class _CountedLabels:
    """Mixin for torchmetrics' exact (``thresholds=None``) multilabel curves metrics: ``compute`` gives NaN for a
    label with no counted row (all ``ignore_index``) instead of torchmetrics' IndexError, and the multilabel value
    (per label, over its counted rows) for the others."""

    _binary_fn = None

    def compute(self) -> torch.Tensor:
        preds, target = dim_zero_cat(self.preds), dim_zero_cat(self.target)   # (N, L), (N, L)
        counted = (target != self.ignore_index).any(0) if target.numel() else torch.zeros(self.num_labels, dtype=bool)
        if bool(counted.all()):
            return super().compute()
        out = torch.full((self.num_labels,), math.nan)
        for j in torch.nonzero(counted).flatten().tolist():
            out[j] = type(self)._binary_fn(preds[:, j], target[:, j], ignore_index=self.ignore_index)
        return out


class CountedMultilabelAUROC(_CountedLabels, MultilabelAUROC):
    """``MultilabelAUROC(average=None)`` with NaN for labels without counted rows."""

    _binary_fn = staticmethod(binary_auroc)


class CountedMultilabelAveragePrecision(_CountedLabels, MultilabelAveragePrecision):
    """``MultilabelAveragePrecision(average=None)`` with NaN for labels without counted rows."""

    _binary_fn = staticmethod(binary_average_precision)


class BinnedMultilabelPrecisionRecallCurve(MultilabelPrecisionRecallCurve):
    """``MultilabelPrecisionRecallCurve(thresholds=T)`` whose update counts without ``torch.bincount``.

    Same state and result as torchmetrics' (``confmat`` of shape (T, L, 2, 2), indexed [threshold, label, target,
    prediction], prediction = ``prob >= threshold``, entries whose target is ``ignore_index`` not counted; tested
    equal to it). torchmetrics' update maps every (row, label, threshold) to one of 4 L T bins and calls its
    ``_bincount``, which under ``torch.use_deterministic_algorithms(True)`` (Lightning's ``deterministic: true``)
    builds an (N L T) x (4 L T) matrix: 16.7 GB at N = 512 rows, L = 10, T = 101. Here the true/false positives per
    (label, threshold) are integer sums of comparisons (exact and deterministic on any device), ``chunk_rows`` rows
    at a time: memory of an update is ``chunk_rows`` x L x T booleans (4 MB) whatever N or the deterministic flag.
    """

    chunk_rows = 4096

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """preds (N, L) probabilities or logits, target (N, L) in {0, 1, ignore_index}."""
        if self.thresholds is None:
            return super().update(preds, target)
        if self.validate_args:
            _multilabel_precision_recall_curve_tensor_validation(preds, target, self.num_labels, self.ignore_index)
        preds, target, thr = _multilabel_precision_recall_curve_format(preds, target, self.num_labels,
                                                                        self.thresholds, self.ignore_index)
        L, T = self.num_labels, len(thr)
        tp = torch.zeros(L, T, dtype=torch.long, device=preds.device)
        fp = torch.zeros_like(tp)
        for s in range(0, len(preds), self.chunk_rows):
            p, y = preds[s:s + self.chunk_rows], target[s:s + self.chunk_rows]        # (n, L)
            above = p.unsqueeze(-1) >= thr                                              # (n, L, T)
            tp += (above & (y == 1).unsqueeze(-1)).sum(0)
            fp += (above & (y == 0).unsqueeze(-1)).sum(0)
        pos = (target == 1).sum(0).unsqueeze(-1)                                        # (L, 1)
        neg = (target == 0).sum(0).unsqueeze(-1)
        state = torch.stack([torch.stack([neg - fp, fp], -1), torch.stack([pos - tp, tp], -1)], -2)  # (L, T, 2, 2)
        self.confmat += state.transpose(0, 1).to(self.confmat.dtype)


class TurnHead(LightningModule):
    """Turn-taking head on frozen features (see module docstring).

    Args:
        head_type: ``linear | mlp | causal_conv | causal_attention`` (``models.heads.HEAD_TYPES``).
        hidden_dim / num_layers / context_rows / dropout / num_heads: head settings (``context_rows``: rows, 5 = 1 s).
        in_dim: feature size D; ``None`` = take it from the datamodule at setup.
        lr / weight_decay: AdamW settings.
        shift_loss_weight: weight of the shift/hold BCE term.
    """

    def __init__(self, head_type: HeadType = "mlp", hidden_dim: int = 256, num_layers: int = 1, context_rows: int = 10,
                 dropout: float = 0.1, num_heads: int = 4, in_dim: int | None = None, lr: float = 1e-3,
                 weight_decay: float = 0.01, shift_loss_weight: float = 1.0):
        super().__init__()
        if head_type not in HEAD_TYPES:
            raise SettingError(f"model.init_args.head_type={head_type!r}: expected one of {list(HEAD_TYPES)}")
        for name, value in (("hidden_dim", hidden_dim), ("num_layers", num_layers), ("context_rows", context_rows),
                            ("num_heads", num_heads)):
            check_int(f"model.init_args.{name}", value, 1)
        check_int("model.init_args.in_dim", in_dim, 1, allow_none=True, none_means="the features' D")
        self.save_hyperparameters()
        self.names = target_names()
        self.head = None if in_dim is None else self._build(in_dim)
        self.metrics = torch.nn.ModuleDict({stage: self._stage_metrics() for stage in ("val", "test")})
        self._sh_count = {"val": 0, "test": 0}
        self._label_count = {st: torch.zeros(NUM_TARGETS, dtype=torch.long) for st in ("val", "test")}
        self.pr_curve = BinnedMultilabelPrecisionRecallCurve(NUM_TARGETS, thresholds=PR_THRESHOLDS,
                                                             ignore_index=-1)
        self._epoch_rows, self._epoch_t0, self._epoch_t1 = 0, 0.0, 0.0

    def _build(self, in_dim: int) -> torch.nn.Module:
        hp = self.hparams
        # one scored row with its causal context: the model summary's FLOPs column counts this forward
        self.example_input_array = torch.zeros(1, hp.context_rows + 1, in_dim)
        return build_head(hp.head_type, in_dim, NUM_TARGETS + 1, hp.hidden_dim, hp.num_layers, hp.context_rows,
                          hp.dropout, hp.num_heads)

    @staticmethod
    def _stage_metrics() -> torch.nn.ModuleDict:
        return torch.nn.ModuleDict({
            # per target; a target with no counted row in an epoch (e.g. future bins past a short session's end)
            # gives NaN, not torchmetrics' IndexError
            "labels": MetricCollection({
                "auroc": CountedMultilabelAUROC(NUM_TARGETS, average=None, ignore_index=-1),
                "ap": CountedMultilabelAveragePrecision(NUM_TARGETS, average=None, ignore_index=-1)}),
            "sh": MetricCollection({"sh_bacc": MulticlassRecall(2, average="macro"),
                                    "sh_f1w": MulticlassF1Score(2, average="weighted")}),
            "sh_auroc": BinaryAUROC(),
        })

    def setup(self, stage: str) -> None:
        if self.head is None:
            dm = self.trainer.datamodule
            dm.setup(stage)  # fails closed on mismatching feature files before any step
            self.hparams.in_dim = dm.feature_dim
            self.head = self._build(dm.feature_dim)

    def _check_in_dim(self) -> None:
        """Fail closed (before any step) when the head's D (from a checkpoint's hyperparameters or
        ``model.init_args.in_dim``) is not the datamodule's feature D."""
        dm = self.trainer.datamodule
        D = getattr(dm, "feature_dim", None)
        if D is not None and self.hparams.in_dim != D:
            src = f"checkpoint {self.trainer.ckpt_path}" if self.trainer.ckpt_path else "model.init_args.in_dim"
            where = getattr(dm, "hparams", {}).get("features_dir", type(dm).__name__)
            raise SettingError(f"the head takes features of size D={self.hparams.in_dim} ({src}), the features in "
                               f"{where} have D={D}")

    def on_fit_start(self) -> None:
        self._check_in_dim()

    def on_validation_start(self) -> None:
        self._check_in_dim()

    def on_test_start(self) -> None:
        self._check_in_dim()

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """states (B, T, D) -> logits (B, T, 11): 10 target logits + shift logit."""
        return self.head(states)

    def model_step(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Shared step: ``(loss, logits (B, T, 11))`` (loss terms in the module docstring)."""
        logits = self(batch["states"])
        mask = batch["mask"]
        bce = F.binary_cross_entropy_with_logits(logits[..., :NUM_TARGETS], batch["targets"], reduction="none")
        loss = (bce * mask).sum() / mask.sum().clamp(min=1)
        ev = batch["shift"] >= 0
        if ev.any():
            sh = F.binary_cross_entropy_with_logits(logits[..., NUM_TARGETS][ev], batch["shift"][ev].float())
            loss = loss + self.hparams.shift_loss_weight * sh
        return loss, logits

    # ---------------------------------------------------------------- training
    def on_train_epoch_start(self) -> None:
        self._epoch_rows, self._epoch_t0 = 0, time.perf_counter()
        self._epoch_t1 = self._epoch_t0

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, _ = self.model_step(batch)
        self._epoch_rows += int(batch["row_valid"].sum())
        B = batch["states"].shape[0]
        self.log("train/loss_step", loss, prog_bar=True, batch_size=B)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=B)   # epoch mean, once per epoch
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        self._epoch_t1 = time.perf_counter()  # after backward and optimizer step

    def on_train_epoch_end(self) -> None:
        dt = self._epoch_t1 - self._epoch_t0  # first batch start .. last training step (no validation)
        self.log("train/epoch_time_s", dt)
        self.log("train/rows_per_s", self._epoch_rows / max(dt, 1e-9))

    # ---------------------------------------------------------------- evaluation
    def _eval_step(self, stage: str, batch: dict[str, torch.Tensor]) -> None:
        loss, logits = self.model_step(batch)
        self.log(f"{stage}/loss", loss, batch_size=batch["states"].shape[0])
        rows = batch["row_valid"]  # (B, T)
        probs = logits[rows][:, :NUM_TARGETS].sigmoid()  # (N, 10)
        tgt = torch.where(batch["mask"][rows], batch["targets"][rows].long(), -1)  # (N, 10), -1 ignored
        m = self.metrics[stage]
        counted = (tgt >= 0).sum(0)                                            # (10,)
        if len(tgt):
            m["labels"].update(probs, tgt)
        self._label_count[stage] += counted.cpu()
        ev = batch["shift"] >= 0
        if ev.any():
            p_shift = logits[..., NUM_TARGETS][ev].sigmoid()
            y = batch["shift"][ev]
            m["sh"].update((p_shift > 0.5).long(), y)
            m["sh_auroc"].update(p_shift, y)
            self._sh_count[stage] += int(ev.sum())
        if stage == "test" and len(tgt):
            self.pr_curve.update(probs.detach(), tgt)

    def _eval_epoch_end(self, stage: str) -> None:
        m = self.metrics[stage]
        out = {}
        counts = self._label_count[stage]
        computed = m["labels"].compute() if int(counts.sum()) else {}
        for key in ("auroc", "ap"):
            # (torchmetrics' trapezoid sums can land a float ulp above 1: clamp to the metric's range)
            vals = computed[key].float().cpu().clamp(0.0, 1.0) if key in computed else torch.full((NUM_TARGETS,),
                                                                                                  math.nan)
            vals = torch.where(counts > 0, vals, math.nan)                                          # (10,)
            out.update({f"{stage}/{key}_{n}": v for n, v in zip(self.names, vals)})
            out[f"{stage}/{key}_mean"] = vals.nanmean()
        m["labels"].reset()
        self._label_count[stage] = torch.zeros(NUM_TARGETS, dtype=torch.long)
        if self._sh_count[stage]:
            out.update({f"{stage}/{k}": v for k, v in m["sh"].compute().items()})
            out[f"{stage}/sh_auroc"] = m["sh_auroc"].compute().clamp(0.0, 1.0)
            out[f"{stage}/sh_events"] = float(self._sh_count[stage])
        m["sh"].reset()
        m["sh_auroc"].reset()
        self._sh_count[stage] = 0
        self.log_dict(out)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step("val", batch)

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step("test", batch)

    def on_test_epoch_start(self) -> None:
        self.pr_curve.reset()

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")
        self._log_pr_curves()

    def pr_curve_rows(self) -> list[list]:
        """``[target, recall, precision]`` rows of the test PR curves (``PR_THRESHOLDS`` + 1 points per target, from
        the bounded-memory :class:`BinnedMultilabelPrecisionRecallCurve`); targets without both classes among their counted
        rows are left out (their curve is undefined)."""
        cm = self.pr_curve.confmat[0]                                   # (10, 2, 2) at the first threshold (0.0)
        pos, neg = cm[:, 1, :].sum(-1), cm[:, 0, :].sum(-1)            # counted positives / negatives per target
        if not int((pos + neg).sum()):
            return []
        precision, recall, _ = self.pr_curve.compute()                  # (10, T + 1) each
        return [[name, float(r), float(p)] for j, name in enumerate(self.names) if pos[j] > 0 and neg[j] > 0
                for p, r in zip(precision[j], recall[j])]

    def _log_pr_curves(self) -> None:
        """One W&B PR chart (all targets) from the test epoch's curve counters; no pandas needed."""
        from lightning.pytorch.loggers import WandbLogger

        wandb_loggers = [lg for lg in self.loggers if isinstance(lg, WandbLogger)]
        rows = self.pr_curve_rows() if wandb_loggers else []
        if not rows:
            return
        import wandb

        table = wandb.Table(columns=["target", "recall", "precision"], data=rows)
        chart = wandb.plot_table("wandb/area-under-curve/v0", table,
                                 {"x": "recall", "y": "precision", "class": "target"},
                                 {"title": "test precision-recall", "x-axis-title": "recall",
                                  "y-axis-title": "precision"})
        for lg in wandb_loggers:
            lg.experiment.log({"test/pr_curves": chart})

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
