"""Shared fixtures: the tiny random VideoLLaMA3 checkpoint (built once per session) and a demo benchmark copy;
every test runs with ``sys.argv`` holding only the program and with deterministic algorithms as it found them."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest



@pytest.fixture(autouse=True, scope="session")
def _program_only_argv():
    """``sys.argv`` = the program only for the whole session, so module- and session-scoped fixtures that run an
    entry point see it too (set up before any function-scoped fixture)."""
    saved = sys.argv
    sys.argv = [saved[0]]
    yield
    sys.argv = saved


@pytest.fixture(autouse=True, scope="session")
def _one_intra_op_thread():
    """One intra-op thread for the session (``torch.set_num_threads(1)``; a test may raise it for itself). The tests'
    models are tiny: an op is microseconds of work, so a second OpenMP thread buys little and every op waits at the
    pool's barrier, badly so when the other core is busy (the decoders' threads, DataLoader workers, a test's own
    subprocesses, another job on the machine). Measured pinned to 2 cores: a ``run_predict`` of the demo (2 budgets,
    8 answer tokens) with other work on the machine took 11-17 s with two threads, 5 s with one; on a quiet machine
    the e2e, hold-sizes, qa-floor and ablation modules took 72 s with two threads, 70 s with one. The subprocesses
    the tests start run with ``OMP_NUM_THREADS=1`` as well, so a reference run here and a subprocess's run reduce in
    the same order."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _isolated_process_state(monkeypatch):
    """``sys.argv`` = the program only (LightningCLI given ``args=`` warns when it also sees pytest's own arguments,
    and must read only what a test passes), and ``torch.use_deterministic_algorithms`` restored after the test (a
    trainer with ``deterministic: true`` turns it on for the whole process; left on, later tests would run the
    deterministic fallbacks of other libraries, e.g. torchmetrics' quadratic-memory bincount)."""
    import torch

    from models.kernels import Fusable

    monkeypatch.setattr(sys, "argv", [sys.argv[0]])
    det, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    mode = Fusable.mode          # process-wide (BudgetedQA(kernels=...) sets it)
    yield
    torch.use_deterministic_algorithms(det, warn_only=warn_only)
    Fusable.mode = mode


@pytest.fixture
def inductor_kernels():
    """The fused kernels through ``torch.compile`` (``kernels: inductor``) for this test: what the tests of
    :class:`models.kernels.Fusable`'s compile path exercise (the default, ``triton``, compiles nothing)."""
    from models.kernels import Fusable, set_mode

    old = set_mode("inductor")
    yield
    Fusable.mode = old

REPO = Path(__file__).resolve().parent.parent
MEDIA = REPO / "assets" / "media"


def load_bench_script(name: str):
    """``bench/<name>.py`` as a module (the bench folder is no package; it goes on ``sys.path`` for the scripts that
    import each other, e.g. ``workload`` -> ``cli_throughput``)."""
    import importlib.util

    bench = REPO / "bench"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location(name, bench / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
DEMO_PARQUET = REPO / "assets" / "videomme" / "test-demo.parquet"


@pytest.fixture(scope="session")
def tiny_vl3_dir(tmp_path_factory) -> Path:
    """A tiny random VideoLLaMA3 + qbase checkpoint written by ``models.videollama3.tiny`` (same path as the demo)."""
    from models.videollama3.tiny import build_tiny_videollama3

    return build_tiny_videollama3(tmp_path_factory.mktemp("tiny-videollama3"), seed=0)


@pytest.fixture(scope="session")
def tiny_vlm(tiny_vl3_dir):
    """The loaded :class:`models.videollama3.BudgetedVideoLlama3` (fp32, CPU)."""
    from models.videollama3 import BudgetedVideoLlama3

    return BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir, raw_mode="orig")


@pytest.fixture
def demo_bench(tmp_path) -> Path:
    """A Video-MME-format benchmark root in tmp_path: ``videomme/test-demo.parquet`` + ``videos/<id>.mp4``."""
    root = tmp_path / "bench"
    (root / "videos").mkdir(parents=True)
    (root / "videomme").mkdir()
    shutil.copy(DEMO_PARQUET, root / "videomme" / DEMO_PARQUET.name)
    for f in MEDIA.glob("*.mp4"):
        shutil.copy(f, root / "videos" / f.name)
    return root


def predict_in_process(cfg: Path) -> None:
    """``python evaluate.py predict --config=cfg`` in this process (one interpreter less to start), on one
    intra-op thread as the tests' subprocess runs (``OMP_NUM_THREADS=1``)."""
    import torch

    import evaluate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        evaluate.cli_main(["predict", f"--config={cfg}"])
    finally:
        torch.set_num_threads(threads)


def run_predict(model_dir: Path, bench_root: Path, out_dir: Path, budgets=(128, 256, 1024), extra: list[str] = (),
                model_args: dict | None = None, plots: bool = False) -> list[dict]:
    """``python evaluate.py predict`` in-process on a benchmark root (a config file layered over the default, as a
    user would); returns the records written. The scores are written without plots unless ``plots`` (matplotlib's
    figures cost about a second a run; tests/callbacks/test_scoring.py checks them)."""
    import yaml

    import evaluate
    from callbacks.jsonl_writer import read_records

    cfg = {
        "trainer": {"enable_progress_bar": False, "callbacks": [
            {"class_path": "callbacks.jsonl_writer.JsonlPredictionWriter", "init_args": {"out_dir": str(out_dir)}},
            {"class_path": "callbacks.scoring.ScoreOnPredictEnd", "init_args": {"plots": plots}}]},
        "model": {"class_path": "lightning_modules.budgeted_qa.BudgetedQA",
                  "init_args": {"model_path": str(model_dir), "budgets": list(budgets), **(model_args or {})}},
        "data": {"class_path": "datamodules.videoqa.VideoQADataModule",
                 "init_args": {"root": str(bench_root), "loader_kwargs": {}, "num_workers": 0}},
    }
    cfg_path = Path(out_dir).parent / f"{Path(out_dir).name}.yaml"
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(yaml.safe_dump(cfg))
    evaluate.cli_main(["predict", f"--config={cfg_path}", *extra])
    return read_records(out_dir)


@pytest.fixture
def train_env(monkeypatch, tmp_path):
    """For ``train.py`` in-process: W&B offline with no API key (``HOME`` in ``tmp_path``, so no ``~/.netrc``), the
    working directory in ``tmp_path`` (the fit configs' relative run folders land there), no traceback override, and
    ``sys.argv`` holding only the program (LightningCLI must see only the arguments a test passes); a W&B run the
    test left open is finished."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("TOKENBUDGET_TRACEBACK", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    yield
    if "wandb" in sys.modules and sys.modules["wandb"].run is not None:   # the next test's logger starts its own run
        sys.modules["wandb"].finish()


@pytest.fixture
def bench_tiny_model_from_session(tiny_vl3_dir, monkeypatch):
    """``bench/qa_throughput.py``'s ``build_tiny_model`` (used by its ``--tiny`` and by ``bench/qa_step_profile.py``)
    loads the session's tiny checkpoint instead of writing a new one: the same checkpoint (``build_tiny_videollama3``
    with its default seed 0, as ``tiny_vl3_dir``), a fresh model object, without the ~5 s write. ``bench/`` is on
    ``sys.path`` for the test (the bench scripts import each other by name)."""
    from models.videollama3 import BudgetedVideoLlama3

    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import qa_throughput

    monkeypatch.setattr(qa_throughput, "build_tiny_model", lambda: BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir))
    return qa_throughput
