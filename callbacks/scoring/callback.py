"""The Lightning callback that scores an output folder at the end of ``trainer.predict``, and its W&B logging."""
from __future__ import annotations

import logging
import os
from collections import defaultdict
from pathlib import Path

from lightning.pytorch import Callback

from .console import format_table, nothing_answered
from .output import SCORES_FILE, compute_scores, save_scores

log = logging.getLogger(__name__)

def _expected_from_datamodule(dm) -> dict[str, list[str]] | None:
    """Duck-typed: ``dm.expected_qids()`` -> {benchmark: qids}, or ``dm.questions`` (Question objects)."""
    if dm is None:
        return None
    fn = getattr(dm, "expected_qids", None)
    if callable(fn):
        return fn()
    questions = getattr(dm, "questions", None)
    if isinstance(questions, (list, tuple)) and questions and hasattr(questions[0], "qid"):
        out: dict[str, list[str]] = defaultdict(list)
        for q in questions:
            out[(getattr(q, "meta", None) or {}).get("benchmark", "unknown")].append(q.qid)
        return dict(out)
    return None


class ScoreOnPredictEnd(Callback):
    """Score the whole output root at the end of ``trainer.predict`` and print the table (global rank 0 only).

    All ranks wait at a barrier first, so every shard's records are on disk. List this callback after the
    prediction writer. Expected qids (for missing counts) come from ``expected_qids`` or, duck-typed, from the
    datamodule's ``expected_qids()`` or ``questions``. When a ``WandbLogger`` is attached, the per-group table is
    also logged to it (offline unless a key is configured).

    Args:
        out_root: the writer's output root; ``None``: taken from the first callback with an ``out_root`` or
            ``output_dir`` attribute.
        plots: render the PNG plots.
        expected_qids: per benchmark, the annotation's qids.
    """

    def __init__(self, out_root: str | None = None, plots: bool = True,
                 expected_qids: dict[str, list[str]] | None = None):
        super().__init__()
        self.out_root = out_root
        self.plots = plots
        self.expected_qids = expected_qids
        self.last_scores: dict | None = None

    def _root(self, trainer) -> Path | None:
        if self.out_root:
            return Path(self.out_root)
        for cb in trainer.callbacks:
            for attr in ("out_root", "output_dir"):
                value = getattr(cb, attr, None)
                if cb is not self and value:
                    return Path(value)
        return None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._scored = False

    def teardown(self, trainer, pl_module, stage: str) -> None:
        # a resumed run with nothing left to do skips the predict loop (and on_predict_end): still print the table
        if stage == "predict" and not getattr(self, "_scored", True):
            self.on_predict_end(trainer, pl_module)

    def on_predict_end(self, trainer, pl_module) -> None:
        self._scored = True
        trainer.strategy.barrier("score_on_predict_end")
        if not trainer.is_global_zero:
            return
        root = self._root(trainer)
        if root is None:
            log.warning("ScoreOnPredictEnd: no out_root given and no writer callback exposes one; not scoring")
            return
        expected = self.expected_qids or _expected_from_datamodule(getattr(trainer, "datamodule", None))
        scores = compute_scores(root, expected)
        try:
            root.mkdir(parents=True, exist_ok=True)
            save_scores(scores, root, plots=self.plots)
        except OSError as e:   # a full disk or a read-only folder: the table still, then one line (issue 44 item 6)
            from callbacks.jsonl_writer import UNWRITABLE, OutputWriteError, unwritable_reason

            if e.errno not in UNWRITABLE:
                raise
            scores["plots"] = []
            self.last_scores = scores
            print(format_table(scores))
            err = OutputWriteError(
                f"{e.filename or root}: {os.strerror(e.errno)} while writing the scores and report; the records in "
                f"{root} are intact. {unwritable_reason(e).capitalize()}, then write them with "
                f"`python -m callbacks.scoring {root}`")
            err.errno = e.errno
            raise err from e
        self.last_scores = scores
        print(format_table(scores))
        print(f"scores: {root / SCORES_FILE}")
        n_errors = nothing_answered(scores.get("groups", []))
        if n_errors:
            from callbacks.run_log import note_nothing_answered

            note_nothing_answered(f"nothing was answered: all {n_errors} records in {root} are error records "
                                  "(each names its file and cause: see the lines above or report.html)")
        from callbacks.report import REPORT_FILE   # here: callbacks.report imports this package

        report = root / REPORT_FILE
        if report.is_file():
            print(f"report: {report}  (open it in a browser: the result first, then every table, plot and error)")
        log_to_wandb(trainer, scores, root)


def log_to_wandb(trainer, scores: dict, root: Path) -> bool:
    """Log the per-group accuracies as a W&B table (key ``scores``) and each PNG plot as an image (key
    ``scores/<plot name>``), when a ``WandbLogger`` is attached to ``trainer`` (offline unless a key is set).
    Returns whether anything was logged."""
    try:
        from lightning.pytorch.loggers import WandbLogger
    except ImportError:  # pragma: no cover
        return False
    loggers = [lg for lg in getattr(trainer, "loggers", []) if isinstance(lg, WandbLogger)]
    if not loggers:
        return False
    columns = ["benchmark", "job", "variant", "budget", "parser", "n_scored", "accuracy", "n_errors",
               "unparseable", "n_missing"]
    data = [[g["benchmark"], g["job"], g["variant"] or "base", g["budget"], parser, g["n_scored"], p["accuracy"],
             g["n_errors"], p["unparseable"], g["n_missing"]]
            for g in scores.get("groups", []) for parser, p in g["parsers"].items()]
    for lg in loggers:
        lg.log_table(key="scores", columns=columns, data=data)
        for name in scores.get("plots", []):
            lg.log_image(key=f"scores/{Path(name).stem}", images=[str(root / name)])
    return True

