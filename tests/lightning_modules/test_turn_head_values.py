"""Values of the turn-head step and of the turn-feature standardization, on hand-made inputs.

* ``TurnHead.model_step``: masked BCE over the 10 targets (mean over counted entries) + ``shift_loss_weight`` x BCE
  over the shift/hold event rows (``lightning_modules/turn_head.py`` module docstring), computed by hand from a stub
  head's fixed logits.
* ``TurnHead`` validation metrics: per-target AUROC / AP over counted rows, S/H balanced accuracy, weighted F1 and
  AUROC over event rows, against hand-computed values and torchmetrics on hand-picked rows.
* ``TurnFeatureDataModule(standardize=True)``: z-scores with the mean / std of the train sessions'
  non-initialization rows (``datamodules/turn_features.py`` docstring), recomputed here from the files.
"""
import math

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc, binary_average_precision

from algorithms.turn_targets import NUM_TARGETS, target_names
from datamodules.features import feature_path, load_features
from datamodules.synthetic_turns import write_synthetic_dataset
from datamodules.turn_features import TurnFeatureDataModule
from lightning_modules.turn_head import TurnHead

LN2, LN3 = math.log(2.0), math.log(3.0)
BIG = 20.0   # logit on entries that must not count: each would add ~20 (or ~40) nats if it did


class FixedLogits(torch.nn.Module):
    """A head that returns the same (B, T, 11) logits whatever the states (checks the states' shape)."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        assert states.shape[:2] == self.logits.shape[:2]
        return self.logits


def _head(logits: torch.Tensor, shift_loss_weight: float = 1.0) -> TurnHead:
    module = TurnHead(head_type="linear", in_dim=3, shift_loss_weight=shift_loss_weight)
    module.head = FixedLogits(logits)
    return module


def _loss_batch() -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """B = 2, T = 4. Item 0: row 0 not counted (targets masked, no event); row 1 all 10 targets counted at logit 0,
    shift event (1) at logit ln 3; row 2 targets 0-4 counted at logit ln 3 with target 1, targets 5-9 masked, hold
    event (0) at logit ln 3; row 3 all counted at logit ln 3 with target 0, no event. Item 1: padding."""
    B, T = 2, 4
    logits = torch.full((B, T, NUM_TARGETS + 1), BIG)
    targets = torch.zeros(B, T, NUM_TARGETS)
    mask = torch.zeros(B, T, NUM_TARGETS, dtype=torch.bool)
    shift = torch.full((B, T), -1, dtype=torch.long)
    row_valid = torch.zeros(B, T, dtype=torch.bool)
    # row 1: BCE(0, y) = ln 2 for either target
    logits[0, 1, :NUM_TARGETS] = 0.0
    targets[0, 1] = torch.tensor([1.0, 0.0] * 5)
    mask[0, 1] = True
    logits[0, 1, NUM_TARGETS], shift[0, 1] = LN3, 1          # sigma = 3/4, y = 1: -ln(3/4)
    # row 2: targets 0-4 y = 1 at sigma 3/4: -ln(3/4) each; 5-9 masked (y = 1 at logit -20: ~20 nats each)
    logits[0, 2, :5], targets[0, 2, :5], mask[0, 2, :5] = LN3, 1.0, True
    logits[0, 2, 5:NUM_TARGETS], targets[0, 2, 5:] = -BIG, 1.0
    logits[0, 2, NUM_TARGETS], shift[0, 2] = LN3, 0          # y = 0: -ln(1/4) = ln 4
    # row 3: y = 0 at sigma 3/4: ln 4 each; no event (its shift logit 20 would cost 40 nats with target -1)
    logits[0, 3, :NUM_TARGETS], mask[0, 3] = LN3, True
    row_valid[0, 1:] = True
    states = torch.zeros(B, T, 3)
    return {"states": states, "targets": targets, "mask": mask, "shift": shift, "row_valid": row_valid}, logits


def test_model_step_loss_is_masked_bce_mean_plus_weighted_event_bce():
    batch, logits = _loss_batch()
    # counted target entries: 10 x ln 2 + 5 x ln(4/3) + 10 x ln 4 = 40 ln 2 - 5 ln 3 over 25 entries
    target_term = (40 * LN2 - 5 * LN3) / 25
    # events: shift at sigma 3/4 -> ln(4/3) = 2 ln 2 - ln 3; hold at sigma 3/4 -> ln 4 = 2 ln 2; mean of the two
    event_term = (4 * LN2 - LN3) / 2
    for w in (1.0, 0.5, 0.0):
        loss, out = _head(logits, w).model_step(batch)
        assert torch.equal(out, logits)
        assert float(loss) == pytest.approx(target_term + w * event_term, abs=1e-5), w
    # no event row in the batch: the target term alone (no NaN mean over zero events)
    no_events = {**batch, "shift": torch.full_like(batch["shift"], -1)}
    assert float(_head(logits, 1.0).model_step(no_events)[0]) == pytest.approx(target_term, abs=1e-5)
    # nothing counted at all: 0, not NaN (the mean's denominator is clamped)
    nothing = {**no_events, "mask": torch.zeros_like(batch["mask"])}
    assert float(_head(logits).model_step(nothing)[0]) == 0.0


def _logit(p: torch.Tensor) -> torch.Tensor:
    return torch.log(p) - torch.log1p(-p)


def _val_batch(seed: int, T: int, events: dict[int, tuple[int, float]]) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """One whole-session validation batch (B = 1): random target probabilities and labels; rows 0-2 not counted
    (initialization), future columns (2-9) of the last 5 rows masked, a few single entries masked; shift/hold
    events at the hand-picked ``{row: (label, p_shift)}``. Returns the batch, probs (T, 10), logits (1, T, 11)."""
    g = torch.Generator().manual_seed(seed)
    probs = 0.05 + 0.9 * torch.rand(T, NUM_TARGETS, generator=g)
    targets = (torch.rand(T, NUM_TARGETS, generator=g) < 0.5).float()
    row_valid = torch.ones(T, dtype=torch.bool)
    row_valid[:3] = False
    mask = row_valid[:, None].repeat(1, NUM_TARGETS)
    mask[T - 5:, 2:] = False
    mask[7, 4] = mask[8, 0] = mask[12, 9] = False
    shift = torch.full((T,), -1, dtype=torch.long)
    p_shift = torch.full((T,), 0.99)           # would be confidently "shift" if a non-event row counted
    for row, (label, p) in events.items():
        assert row_valid[row]
        shift[row], p_shift[row] = label, p
    logits = torch.cat([_logit(probs), _logit(p_shift)[:, None]], 1)[None]
    batch = {"states": torch.zeros(1, T, 3), "targets": targets[None], "mask": mask[None], "shift": shift[None],
             "row_valid": row_valid[None]}
    return batch, probs, logits


def _pairwise_auroc(scores: list[float], labels: list[int]) -> float:
    """Mann-Whitney AUROC: P(score of a positive > score of a negative), ties 1/2."""
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def test_validation_metrics_on_hand_picked_rows():
    # events over the two sessions, labels (1 shift, 0 hold) and shift probabilities:
    #   labels [1, 1, 0, 1, 0], p [0.9, 0.8, 0.2, 0.3, 0.6] -> predictions (p > 0.5) [1, 1, 0, 0, 1]
    a, probs_a, logits_a = _val_batch(0, 30, {5: (1, 0.9), 11: (1, 0.8), 17: (0, 0.2)})
    b, probs_b, logits_b = _val_batch(1, 26, {4: (1, 0.3), 9: (0, 0.6)})
    module = TurnHead(head_type="linear", in_dim=3)
    logged: dict = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, value)
    module.log_dict = lambda values, **kw: logged.update(values)
    for batch, logits in ((a, logits_a), (b, logits_b)):
        module.head = FixedLogits(logits)
        module.validation_step(batch, 0)
    module.on_validation_epoch_end()
    # S/H by hand: recall(shift) = 2/3, recall(hold) = 1/2 -> balanced accuracy 7/12; F1(shift): P = R = 2/3 -> 2/3,
    # F1(hold): P = R = 1/2 -> 1/2; weighted by support (3 shifts, 2 holds): (3 * 2/3 + 2 * 1/2) / 5 = 3/5;
    # AUROC: positives {0.9, 0.8, 0.3} vs negatives {0.2, 0.6}: 5 of 6 pairs ordered -> 5/6
    assert float(logged["val/sh_bacc"]) == pytest.approx(7 / 12, abs=1e-6)
    assert float(logged["val/sh_f1w"]) == pytest.approx(3 / 5, abs=1e-6)
    assert float(logged["val/sh_auroc"]) == pytest.approx(5 / 6, abs=1e-6)
    assert float(logged["val/sh_events"]) == 5.0
    # per target: only counted entries (row_valid and mask) of both sessions
    aurocs, aps = [], []
    for j, name in enumerate(target_names()):
        p, y = [], []
        for batch, probs in ((a, probs_a), (b, probs_b)):
            keep = batch["mask"][0, :, j] & batch["row_valid"][0]
            p.append(probs[keep, j])
            y.append(batch["targets"][0, keep, j].long())
        p, y = torch.cat(p), torch.cat(y)
        assert 0 < int(y.sum()) < len(y)
        want_auroc = _pairwise_auroc(p.tolist(), y.tolist())
        assert want_auroc == pytest.approx(float(binary_auroc(p, y)), abs=1e-6)    # the two references agree
        want_ap = float(binary_average_precision(p, y))
        assert float(logged[f"val/auroc_{name}"]) == pytest.approx(want_auroc, abs=1e-5), name
        assert float(logged[f"val/ap_{name}"]) == pytest.approx(want_ap, abs=1e-5), name
        aurocs.append(want_auroc)
        aps.append(want_ap)
    assert float(logged["val/auroc_mean"]) == pytest.approx(sum(aurocs) / NUM_TARGETS, abs=1e-5)
    assert float(logged["val/ap_mean"]) == pytest.approx(sum(aps) / NUM_TARGETS, abs=1e-5)
    # the per-batch loss is the model_step loss of that batch
    assert float(logged["val/loss"]) == pytest.approx(float(_head(logits_b).model_step(b)[0]), abs=1e-6)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    # seed 19: the wearer (participant 2) speaks in each of the 10-s sessions (no "never speaks" warning)
    return write_synthetic_dataset(tmp_path_factory.mktemp("std_turns"), num_sessions=4, duration_s=10.0, dim=6,
                                   seed=19, modes=("completed-block-hold",))


def test_standardization_uses_train_non_initialization_rows(synth):
    mode = "completed-block-hold"     # its first 9 rows are zeros flagged by initialization_mask
    kw = dict(features_dir=str(synth / "features"), expected_mode=mode, utterances_root=str(synth / "transcripts"),
              utterances_loader="datamodules.turn_features.load_utterances_json", expected_layer=-1,
              train_sessions=[1, 2], val_sessions=[3], test_sessions=[4], initialization_rows="keep")
    raw = {n: load_features(feature_path(synth / "features", f"Session_{n}", mode))[0] for n in (1, 2, 3, 4)}
    assert all(raw[n]["initialization_mask"].tolist()[:10] == [1] * 9 + [0] for n in raw)
    plain = TurnFeatureDataModule(standardize=False, **kw).load()
    std = TurnFeatureDataModule(standardize=True, **kw).load()
    for split, nums in (("train", [1, 2]), ("val", [3]), ("test", [4])):
        for s, n in zip(plain[split], nums):
            assert torch.equal(s.states, raw[n]["states"])
    # statistics from the train sessions' rows outside initialization only (float64, sample std: ddof = 1)
    rows = np.concatenate([raw[n]["states"].double().numpy()[raw[n]["initialization_mask"].numpy() == 0]
                           for n in (1, 2)])
    assert rows.shape == (2 * (50 - 9), 6)
    mu, sigma = rows.mean(0), rows.std(0, ddof=1)
    for split, nums in (("train", [1, 2]), ("val", [3]), ("test", [4])):
        for s, n in zip(std[split], nums):
            want = (raw[n]["states"].double().numpy() - mu) / sigma
            np.testing.assert_allclose(s.states.double().numpy(), want, rtol=0, atol=1e-5, err_msg=f"Session_{n}")
    # the initialization rows do not enter the statistics (with them the zeros would move the mean)
    with_init = np.concatenate([raw[n]["states"].double().numpy() for n in (1, 2)])
    assert np.abs(with_init.mean(0) - mu).max() > 1e-2
