"""Issue 43 items 2 and 3: errors that were still tracebacks end in one line, and Ctrl-C exits 130 saying how many
records are kept and how to resume (all in this process: ``cli.main`` is what ``python evaluate.py`` runs)."""
from __future__ import annotations

import signal
import sys

import pytest
from lightning.pytorch import Callback

from tests.conftest import REPO

TRACEBACK_HINT = "(set TOKENBUDGET_TRACEBACK=1 for the full traceback)"


@pytest.fixture(autouse=True)
def _argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["evaluate.py"])     # LightningCLI must see only the arguments a test passes
    monkeypatch.delenv("TOKENBUDGET_TRACEBACK", raising=False)


def _main_exit(capsys, args: list[str]) -> tuple[int, list[str]]:
    """``cli.main`` on ``evaluate.py`` ``args``: (exit status, stderr lines)."""
    import evaluate
    from cli import main

    with pytest.raises(SystemExit) as info:
        main(lambda: evaluate.cli_main(args))
    return info.value.code, capsys.readouterr().err.strip().splitlines()


def test_an_unknown_ablation_variant_is_one_line_naming_it_and_the_known_ones(capsys, tmp_path):
    """``--model.init_args.jobs=base:128, rho99:128`` printed 79 lines under jsonargparse's model union, status 1."""
    out = tmp_path / "out"
    code, err = _main_exit(capsys, ["predict", f"--config={REPO / 'configs/predict/ablate.yaml'}",
                                    "--model.init_args.jobs=base:128, rho99:128",
                                    f"--trainer.callbacks.init_args.out_dir={out}"])
    assert code == 2
    # the known variants: seed 000's sixteen, the three rho<R>fv2 and the baseline (configs/predict/ablate.yaml)
    known = ("rho16, rho32, rho32nf, rho64, rho128, rho256, rho32fv2, rho64fv2, rho128fv2, qtf1, qtf2, low64, "
             "sel_resize, sel_merge, mean_merge, uni8, uni16, hivar, base")
    assert err[-2:] == [f"error: SettingError: model.init_args.jobs: job 'rho99:128': unknown layout variant "
                        f"'rho99'; known: {known}", TRACEBACK_HINT]
    assert not any("Traceback" in ln or "Union subtypes" in ln for ln in err)
    assert not out.exists()


def test_convert_on_a_missing_folder_is_one_line(capsys, tmp_path, monkeypatch):
    from models.videollama3.convert import main

    missing = tmp_path / "nowhere"
    with pytest.raises(SystemExit) as info:
        main([str(missing), str(tmp_path / "out")])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: FileNotFoundError: {missing}: no such folder (the original-layout checkpoint to convert)"]
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv("TOKENBUDGET_TRACEBACK", "1")                 # the traceback on request
    with pytest.raises(FileNotFoundError, match="no such folder"):
        main([str(missing), str(tmp_path / "out")])


@pytest.mark.parametrize("installed, gpu, why", [
    (False, True, "PyNvVideoCodec is not installed (pip install -e '.[nvdec]')"),
    (True, False, "no CUDA GPU in this process (NVDEC decodes on the GPU)")])
def test_decoder_nvdec_names_the_missing_package_or_gpu(demo_bench, monkeypatch, installed, gpu, why):
    """Before: "decord was imported before PyNvVideoCodec" whatever the cause."""
    import importlib.util

    import torch

    from algorithms.errors import SettingError
    from datamodules.videoqa import VideoQADataModule

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        (real("json") if installed else None) if name == "PyNvVideoCodec" else real(name, *a)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    dm = VideoQADataModule(root=str(demo_bench), loader_kwargs={}, decoder="nvdec", num_workers=0)
    with pytest.raises(SettingError) as info:
        dm.setup("predict")
    assert str(info.value) == (f"data.init_args.decoder=nvdec: {why}; use decoder cpu (or auto, which falls back to "
                               "the CPU per file)")


class InterruptAfterFirstVideo(Callback):
    """Ctrl-C after the first video's records are written (the writer is an earlier callback)."""

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        raise KeyboardInterrupt


def test_ctrl_c_exits_130_saying_how_many_records_are_kept(tiny_vl3_dir, demo_bench, tmp_path, capsys):
    """Before: Lightning's ``sys.exit(1)`` after its graceful shutdown, and nothing said."""
    import yaml

    from callbacks.jsonl_writer import read_records

    out = tmp_path / "out"
    cfg = {"trainer": {"enable_progress_bar": False, "callbacks": [
        {"class_path": "callbacks.jsonl_writer.JsonlPredictionWriter", "init_args": {"out_dir": str(out)}},
        {"class_path": "callbacks.timing.StageTimer"}, {"class_path": f"{__name__}.InterruptAfterFirstVideo"}]},
        "model": {"class_path": "lightning_modules.budgeted_qa.BudgetedQA",
                  "init_args": {"model_path": str(tiny_vl3_dir), "budgets": [128], "max_new_tokens": 2}},
        "data": {"class_path": "datamodules.videoqa.VideoQADataModule",
                 "init_args": {"root": str(demo_bench), "loader_kwargs": {}, "num_workers": 0}}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    sigint = signal.getsignal(signal.SIGINT)
    try:
        code, err = _main_exit(capsys, ["predict", f"--config={path}"])
    finally:
        signal.signal(signal.SIGINT, sigint)       # Lightning ignores further Ctrl-C during its shutdown
    assert code == 130
    # the first video (realshort, the cheaper one goes first) has 3 questions x 1 budget
    assert len(read_records(out)) == 3
    assert err[-1] == f"interrupted: 3 records kept in {out}; run the same command to resume"
    import json

    timing = json.loads((out / "timing_rank0.json").read_text())   # the interrupted run's figures are kept
    assert timing["interrupted"] is True and timing["videos"] == 1 and len(timing["per_video"]) == 1
    assert timing["per_video"][0]["video_id"] == read_records(out)[0]["video"]
    cfg["trainer"]["callbacks"].pop(2)                               # the same command again, not interrupted
    path.write_text(yaml.safe_dump(cfg))
    import evaluate

    evaluate.cli_main(["predict", f"--config={path}"])
    resumed = json.loads((out / "timing_rank0.json").read_text())
    assert resumed["videos"] == 1 and "interrupted" not in resumed   # the second video only
    assert [r.get("interrupted") for r in resumed["previous_runs"]] == [True]
    records = read_records(out)                                      # the demo's 7 questions, none twice
    assert len(records) == 7 == len({(r["qid"], r["job"]) for r in records})


def test_interrupted_recognises_lightnings_exit_after_a_keyboard_interrupt():
    from cli import interrupted

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            sys.exit(1)                     # what lightning.pytorch.trainer.call._call_and_handle_interrupt does
    except SystemExit as e:
        assert interrupted(e)
    assert interrupted(KeyboardInterrupt())
    assert not interrupted(SystemExit(2)) and not interrupted(SystemExit(0))


def test_ctrl_c_during_the_imports_is_one_line_and_status_130(tmp_path):
    """Ctrl-C while ``evaluate.py`` still imports torch / Lightning (its first seconds): one line and status 130,
    not a traceback (found by a new-user trial); nothing is written."""
    import os
    import subprocess
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "evaluate.py", "predict", f"--trainer.callbacks.init_args.out_dir={out}"],
                            cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    time.sleep(0.8)                         # importing: torch alone takes longer than this
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "interrupted while starting: nothing was run or written"
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("case", ["another family", "no weights"])
def test_a_checkpoint_of_another_family_or_without_weights_is_one_line(capsys, tmp_path, tiny_vl3_dir, demo_bench,
                                                                      case):
    """A Qwen2.5-Omni folder given as ``model_path`` ended in a 40-frame traceback ("embed_dim must be divisible by
    num_heads"), a folder of config files only in transformers' "no file named model.safetensors": one line each
    now, status 2, nothing written."""
    import json
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_vl3_dir, ckpt)
    if case == "another family":
        cfg = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen2_5_omni_thinker"}))
        want = (f"error: CheckpointError: {ckpt}: config.json's model_type is 'qwen2_5_omni_thinker', not a "
                "VideoLLaMA3 checkpoint (expected 'video_llama_3')")
    else:
        for f in ckpt.glob("*.safetensors"):
            f.unlink()
        want = (f"error: CheckpointError: {ckpt}: config.json but no weights file beside it (none of *.safetensors, "
                "*.bin, *.pt, *.pth); copy the whole VideoLLaMA3 checkpoint")
    out = tmp_path / "out"
    code, err = _main_exit(capsys, ["predict", f"--model.init_args.model_path={ckpt}",
                                    f"--data.init_args.root={demo_bench}", "--data.init_args.num_workers=0",
                                    "--data.init_args.loader_kwargs={}",
                                    f"--trainer.callbacks.init_args.out_dir={out}"])
    assert code == 2 and err[-2:] == [want, TRACEBACK_HINT]
    assert not out.exists()


def test_the_omni_loader_refuses_a_videollama3_folder_before_loading(tmp_path):
    """``configs/extract`` with a VideoLLaMA3 ``model_dir`` loaded it into the thinker (a table of missing weights)
    and then failed on its feature extractor, 162 lines: one error naming the model_type now."""
    import json

    from algorithms.errors import CheckpointError
    from models.loading import load_omni_thinker

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "video_llama_3"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"model_type is 'video_llama_3', not a Qwen2\.5-Omni thinker checkpoint "
                                              r"\(expected 'qwen2_5_omni_thinker' or 'qwen2_5_omni'\)"):
        load_omni_thinker(tmp_path)
