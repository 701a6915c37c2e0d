"""Every predict YAML in configs/ is instantiated through the CLI (classes built, no run). The extract YAMLs are
instantiated by tests/models/omni/test_omni_extract.py (they load the thinker at construction), the fit and sweep YAMLs by
tests/entry_points/test_train.py."""
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs" / "predict").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_predict_config_instantiates(path, tmp_path):
    from lightning.pytorch import LightningDataModule, LightningModule

    import evaluate

    text = path.read_text()
    assert text.startswith("# python evaluate.py predict"), "each YAML starts with the command that runs it"
    cfg = yaml.safe_load(text)
    cfg.pop("return_predictions", None)  # a `predict` subcommand argument; run=False builds without subcommands
    plain = tmp_path / path.name
    plain.write_text(yaml.safe_dump(cfg))
    cli = evaluate.cli_main(["--config", str(plain)], run=False)
    assert isinstance(cli.model, LightningModule) and isinstance(cli.datamodule, LightningDataModule)
    assert type(cli.model).__name__ == cfg["model"]["class_path"].rsplit(".", 1)[1]
    assert type(cli.datamodule).__name__ == cfg["data"]["class_path"].rsplit(".", 1)[1]
    # the output folder has a command-line override: the writer is the last callback
    cli = evaluate.cli_main(["--config", str(plain), f"--trainer.callbacks.init_args.out_dir={tmp_path / 'o'}"],
                            run=False)
    (writer,) = [cb for cb in cli.trainer.callbacks if type(cb).__name__ == "JsonlPredictionWriter"]
    assert writer.out_dir == tmp_path / "o"


def test_missing_checkpoints_fail_fast_naming_the_path(tmp_path):
    """A model path that does not exist is an error naming it, never a hub lookup."""
    from models.omni.thinker import OmniThinkerRunner
    from models.videollama3 import BudgetedVideoLlama3

    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere.*models.videollama3.tiny"):
        BudgetedVideoLlama3.from_pretrained(missing)
    with pytest.raises(FileNotFoundError, match="nowhere.*models.omni.tiny"):
        OmniThinkerRunner(missing)


def test_bad_settings_print_one_line_in_one_process(tmp_path, capsys, monkeypatch):
    """The default run's twin of the subprocess sweep below, every case in this process through ``cli.main`` (what
    ``python evaluate.py`` runs): one line naming the setting or path, exit status 2; TOKENBUDGET_TRACEBACK=1
    re-raises the error (Python prints its traceback); a value of the wrong type is jsonargparse's error after a
    one-line usage."""
    import sys

    import evaluate
    from cli import main

    monkeypatch.delenv("TOKENBUDGET_TRACEBACK", raising=False)
    monkeypatch.setattr(sys, "argv", ["evaluate.py"])
    monkeypatch.chdir(tmp_path)
    cfg = str(REPO / "configs" / "extract" / "completed_block_hold.yaml")
    for extra, want in BAD_SETTINGS(tmp_path):
        with pytest.raises(SystemExit) as info:
            main(lambda: evaluate.cli_main(["predict", "--config", cfg, *extra]))
        err = capsys.readouterr().err
        assert info.value.code == 2 and "Traceback" not in err
        assert f"\n{want}" in err and err.rstrip().endswith("\n(set TOKENBUDGET_TRACEBACK=1 for the full traceback)")
    monkeypatch.setenv("TOKENBUDGET_TRACEBACK", "1")
    with pytest.raises(ValueError, match="unknown memory_policy 'exact'"):   # re-raised as jsonargparse wraps it
        main(lambda: evaluate.cli_main(["predict", "--config", cfg, *BAD_SETTINGS(tmp_path)[0][0]]))
    monkeypatch.delenv("TOKENBUDGET_TRACEBACK")
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as info:
        main(lambda: evaluate.cli_main(["predict", "--data.init_args.decode_threads=1.5"]))
    # (the earlier cases' Lightning log handler, set up in this process, may add its "INFO: Seed set to 0" line)
    err = "".join(ln for ln in capsys.readouterr().err.splitlines(True) if not ln.startswith("INFO: "))
    assert info.value.code == 2
    assert "error: data.init_args.decode_threads: expected int or NoneType, got 1.5 (VideoQADataModule)" in err
    assert err.startswith("usage: evaluate.py [options] predict [-c CONFIG] [--section.key VALUE ...]")
    assert "--trainer.max_epochs" not in err and len(err.splitlines()) == 3


def BAD_SETTINGS(tmp_path):   # noqa: N802 - (extra arguments, the line expected) of both sweeps
    return [(["--model.init_args.memory_policy=exact"],
             "error: SettingError: unknown memory_policy 'exact'; expected one of ('window', 'sliding')"),
            ([f"--model.init_args.model_dir={tmp_path / 'nowhere'}"],
             f"error: FileNotFoundError: no Qwen2.5-Omni thinker checkpoint at {tmp_path / 'nowhere'}")]


@pytest.mark.slow   # ~36 s on 2 cores: four interpreters (twin above, in this process)
def test_bad_settings_print_one_line_not_a_traceback(tmp_path):
    """A bad setting or path given to the CLI ends in one line naming it (exit status 2); library bugs keep their
    traceback; TOKENBUDGET_TRACEBACK=1 shows the traceback."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TOKENBUDGET_TRACEBACK", None)
    cfg = str(REPO / "configs" / "extract" / "completed_block_hold.yaml")
    cases = BAD_SETTINGS(tmp_path)
    for extra, want in cases:
        r = subprocess.run([sys.executable, str(REPO / "evaluate.py"), "predict", "--config", cfg, *extra],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert r.returncode == 2, r.stderr[-2000:]
        assert want in r.stderr and "Traceback" not in r.stderr
        assert f"\n{want}" in r.stderr          # on a line of its own, never glued to a progress bar
    r = subprocess.run([sys.executable, str(REPO / "evaluate.py"), "predict", "--config", cfg, *cases[0][0]],
                       capture_output=True, text=True, env={**env, "TOKENBUDGET_TRACEBACK": "1"}, cwd=tmp_path,
                       timeout=300)
    assert r.returncode != 0 and "Traceback" in r.stderr
    # a value of the wrong type: jsonargparse's error after a one-line usage (not the list of every option)
    r = subprocess.run([sys.executable, str(REPO / "evaluate.py"), "predict", "--data.init_args.decode_threads=1.5"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert r.returncode == 2
    assert "error: data.init_args.decode_threads: expected int or NoneType, got 1.5 (VideoQADataModule)" in r.stderr
    assert r.stderr.startswith("usage: evaluate.py [options] predict [-c CONFIG] [--section.key VALUE ...]")
    assert "--trainer.max_epochs" not in r.stderr and len(r.stderr.splitlines()) == 3


def test_user_error_picks_the_projects_own_error_from_the_chain():
    import torch

    from algorithms.errors import SettingError
    from datamodules.features import FeatureFileError
    from cli import user_error

    def wrapped(inner, outer=ValueError("Does not validate against any of the Union subtypes")):
        try:
            try:
                raise inner
            except Exception as e:
                raise outer from e
        except Exception as o:
            return o

    assert str(user_error(wrapped(FeatureFileError("x.safetensors: bad")))) == "x.safetensors: bad"
    assert str(user_error(wrapped(SettingError("unknown memory_policy 'x'")))) == "unknown memory_policy 'x'"
    assert isinstance(user_error(wrapped(FileNotFoundError("/ckpt/config.json"))), FileNotFoundError)
    # the outermost project error wins over the path error it wraps
    got = user_error(wrapped(FileNotFoundError("f"), FeatureFileError("f.safetensors: needs this file")))
    assert isinstance(got, FeatureFileError)
    # internal checks, library errors and other OS errors keep their traceback
    assert user_error(wrapped(ValueError("max() arg is an empty sequence"))) is None
    assert user_error(OSError(28, "No space left on device")) is None
    assert user_error(RuntimeError("CUDA error")) is None
    # Lightning's conflicting-settings error (e.g. enable_progress_bar=false beside a TQDMProgressBar callback)
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    mis = MisconfigurationException("Trainer was configured with `enable_progress_bar=False` but found ...")
    assert user_error(wrapped(mis)) is mis
    try:
        torch.zeros(2).view(3)
    except Exception as e:
        assert user_error(e) is None
    # a suppressed context ("raise ... from None") is not followed
    try:
        try:
            raise FileNotFoundError("hidden")
        except FileNotFoundError:
            raise AttributeError("a bug") from None
    except AttributeError as e:
        assert user_error(e) is None
