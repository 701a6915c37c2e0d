"""models.early_weights: the checkpoint named on the predict command line read beside the CLI's imports, and taken
by the load only when it reads the same files to the same device (a read of other files is dropped)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from models import early_weights as ew

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "predict" / "demo.yaml"
VIDEOMME = REPO / "configs" / "predict" / "videomme.yaml"


@pytest.fixture(autouse=True)
def _clean():
    ew._EARLY.clear()
    ew._MARKS.clear()
    yield
    ew.take([], "cpu")          # nothing held after a test
    ew._MARKS.clear()


@pytest.mark.parametrize("argv,want", [
    ([], {"class_path": ew.VL3_MODULE, "model_path": "checkpoints/tiny-videollama3"}),
    (["--config", str(VIDEOMME)], {"class_path": ew.VL3_MODULE, "model_path": "/ckpt/videollama3-7b-qbase"}),
    ([f"--config={VIDEOMME}", "--model.init_args.model_path=/x"], {"class_path": ew.VL3_MODULE, "model_path": "/x"}),
    (["--config", str(VIDEOMME), "--model.init_args.model_path", "/y", "--model.init_args.weight_reader=library"],
     {"class_path": ew.VL3_MODULE, "model_path": "/y", "weight_reader": "library"}),
    (["--model.model_path=/z"], {"class_path": ew.VL3_MODULE, "model_path": "/z"}),
    (["--model", "other.yaml"], None),
    (["--model.init_args=other.yaml"], None),
    (["--help"], None),
    (["--print_config"], None),
    (["--config"], None),
    (["--trainer.accelerator=cpu"], None),
    (["--trainer.accelerator", "cpu"], None),
    (["--trainer.accelerator", "gpu"], {"class_path": ew.VL3_MODULE, "model_path": "checkpoints/tiny-videollama3"}),
])
def test_the_model_block_as_the_cli_sees_it(argv, want):
    got = ew._cli_values(argv, DEMO)
    if want is None:
        assert got is None
    else:
        assert {k: got.get(k) for k in want} == want and all(k in want or k == "weight_reader" for k in got)


def test_another_class_in_a_later_config_drops_the_earlier_init_args(tmp_path):
    other = tmp_path / "omni.yaml"
    other.write_text("model:\n  class_path: lightning_modules.omni.OmniFeatures\n  init_args:\n    chunk_s: 2\n")
    assert ew._cli_values(["--config", str(other)], DEMO) == {"class_path": "lightning_modules.omni.OmniFeatures"}


def _start_on_cpu(monkeypatch, argv):
    import models.device_start as ds

    monkeypatch.setattr(ds, "predict_on_nvidia_machine", lambda a, s: True)
    monkeypatch.setattr(ew, "_device", lambda: torch.device("cpu"))
    thread = ew.start_weights_early(["predict", *argv], DEMO)
    assert thread is not None
    thread.join()


def _count_reads(monkeypatch) -> list:
    """The files of every ``ReadAhead`` started from now on, one list per read."""
    import models.weight_reader as wr

    made = []
    real_init = wr.ReadAhead.__init__

    def init(self, *a, **kw):
        made.append(a[0])
        real_init(self, *a, **kw)

    monkeypatch.setattr(wr.ReadAhead, "__init__", init)
    return made


def test_the_load_takes_the_early_read_of_its_own_files(tiny_vl3_dir, monkeypatch):
    """The read started from the command line is the one the pinned load uses (no second ReadAhead), with the
    library loader's parameters, and its start is given for the timeline."""
    import models.weight_reader as wr
    from models.videollama3 import BudgetedVideoLlama3

    made = _count_reads(monkeypatch)
    _start_on_cpu(monkeypatch, [f"--model.init_args.model_path={tiny_vl3_dir}"])
    assert len(made) == 1 and ew._EARLY["files"] == [f.resolve() for f in wr.checkpoint_files(tiny_vl3_dir)]
    pinned = BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir, weight_reader="pinned")
    assert len(made) == 1 and not ew._EARLY                     # taken: no read of its own
    assert set(ew.early_weight_marks()) == {"weights_early_start"}
    lib = BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir)
    a, b = lib.model.state_dict(), pinned.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_read_of_other_files_is_dropped_and_the_load_reads_its_own(tiny_vl3_dir, tmp_path, monkeypatch):
    import models.weight_reader as wr
    from models.videollama3 import BudgetedVideoLlama3

    other = tmp_path / "other"
    shutil.copytree(tiny_vl3_dir, other)
    _start_on_cpu(monkeypatch, [f"--model.init_args.model_path={other}"])
    made = _count_reads(monkeypatch)
    BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir, weight_reader="pinned")
    assert made == [wr.checkpoint_files(tiny_vl3_dir)] and not ew._EARLY and ew.early_weight_marks() == {}


@pytest.mark.parametrize("extra", [["--model.init_args.weight_reader=library"], ["--config", "missing.yaml"],
                                   ["--model.init_args.model_path=/no/such/dir"]])
def test_nothing_starts_where_the_load_would_not_read_pinned(tiny_vl3_dir, monkeypatch, extra):
    import models.device_start as ds

    monkeypatch.setattr(ds, "predict_on_nvidia_machine", lambda a, s: True)
    monkeypatch.setattr(ew, "_device", lambda: torch.device("cpu"))
    argv = ["predict", f"--model.init_args.model_path={tiny_vl3_dir}", *extra]
    assert ew.start_weights_early(argv, DEMO) is None and not ew._EARLY


def test_off_without_a_gpu_node_or_with_the_switch(tiny_vl3_dir, monkeypatch):
    argv = ["predict", f"--model.init_args.model_path={tiny_vl3_dir}"]
    monkeypatch.setenv(ew.ENV_SWITCH, "0")
    assert ew.start_weights_early(argv, DEMO) is None
