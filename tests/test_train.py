"""train.py on synthetic cached features: learning, fail-closed checks, W&B offline, every fit/sweep config."""
import shlex
import sys
from pathlib import Path

import pytest
import torch
import yaml

from datamodules.features import FeatureFileError, feature_path, load_features, save_features
from datamodules.synthetic_turns import MODES, write_synthetic_dataset
from datamodules.turn_features import TurnFeatureDataModule
from train import cli_main

ROOT = Path(__file__).resolve().parents[1]
BASE = str(ROOT / "configs/fit/turn_head.yaml")
DEMO = str(ROOT / "configs/fit/turn_head_demo.yaml")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_synthetic_dataset(tmp_path_factory.mktemp("demo_turns"), num_sessions=12, duration_s=60.0, dim=32)


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc key
    monkeypatch.chdir(tmp_path)  # relative run folders of the configs land here
    monkeypatch.setattr(sys, "argv", ["train.py"])  # LightningCLI must see only the args we pass


def fit_args(demo, tmp_path, *extra):
    return ["fit", "--config", BASE, "--config", DEMO, f"--data.init_args.features_dir={demo / 'features'}",
            f"--data.init_args.utterances_root={demo / 'transcripts'}", f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", *extra]


def test_fit_learns_logs_offline_and_tests_best_checkpoint(demo, tmp_path):
    cli = cli_main(fit_args(demo, tmp_path, "--trainer.max_epochs=3", f"--trainer.logger.init_args.save_dir={tmp_path}"))
    m = cli.trainer.callback_metrics
    assert float(m["val/auroc_mean"]) > 0.9
    assert float(m["train/rows_per_s"]) > 0 and "val/sh_bacc" in m and "val/ap_va_wearer" in m
    assert cli.trainer.logger.experiment.settings.mode == "offline" or cli.trainer.logger._offline
    res = cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path="best", verbose=False)[0]
    assert res["test/auroc_mean"] > 0.9 and 0 <= res["test/sh_f1w"] <= 1
    assert list(tmp_path.glob("**/checkpoints/best.ckpt")) and list(tmp_path.glob("wandb/offline-run-*"))


def _fails_before_training(demo, tmp_path, match, *extra):
    with pytest.raises(FeatureFileError, match=match):
        cli_main(fit_args(demo, tmp_path, "--trainer.logger=false", *extra))
    assert not list(tmp_path.glob("**/*.ckpt"))


def test_mode_mismatch_fails_before_training(demo, tmp_path):
    bad = tmp_path / "features"
    bad.mkdir()
    for f in (demo / "features").glob("*.open-stream-replay.safetensors"):
        (bad / f.name).symlink_to(f)
    # a hold file renamed as replay: the name matches, the metadata does not
    src = feature_path(demo / "features", "Session_4", "completed-block-hold")
    tensors, meta = load_features(src)
    (bad / "Session_4.open-stream-replay.safetensors").unlink()
    save_features(feature_path(bad, "Session_4", "open-stream-replay"), tensors, meta)
    _fails_before_training(demo, tmp_path, r"Session_4\.open-stream-replay\.safetensors.*mode",
                           f"--data.init_args.features_dir={bad}")
    # no file of the expected mode at all
    _fails_before_training(demo, tmp_path, "no feature files for expected_mode='micro-chunk-200ms'",
                           f"--data.init_args.features_dir={bad}", "--data.init_args.expected_mode=micro-chunk-200ms")
    # run settings: memory, fps, layer
    _fails_before_training(demo, tmp_path, r"Session_\d+\.open-stream-replay\.safetensors.*memory_s",
                           "--data.init_args.expected_memory_s=4.0")
    _fails_before_training(demo, tmp_path, "layer", "--data.init_args.expected_layer=12")
    # memory policy: the synthetic files have no field (= window) and window names; a sliding run finds none
    _fails_before_training(demo, tmp_path, "no feature files for expected_mode='open-stream-replay', "
                           "expected_memory_policy='sliding'", "--data.init_args.expected_memory_policy=sliding")


def test_datamodule_splits_and_initialization_rows(demo):
    kw = dict(features_dir=str(demo / "features"), utterances_root=str(demo / "transcripts"),
              utterances_loader="datamodules.turn_features.load_utterances_json", expected_layer=-1)
    dm = TurnFeatureDataModule(expected_mode="completed-block-hold", initialization_rows="exclude", **kw)
    data = dm.load()
    assert [s.session for s in data["val"]] == ["Session_4", "Session_12"] and dm.feature_dim == 32
    s = data["train"][0]
    assert s.initialization_mask[:9].all() and not s.initialization_mask[9:].any()
    assert not s.mask[:9].any() and s.mask[9:, :2].all()
    dm2 = TurnFeatureDataModule(expected_mode="open-stream-replay", initialization_rows="exclude", **kw)
    assert dm2.load()["train"][0].row_valid.all()
    dm3 = TurnFeatureDataModule(expected_mode="open-stream-replay", initialization_rows="exclude_any_mode", **kw)
    assert torch.equal(dm3.load()["train"][0].row_valid, ~s.initialization_mask)  # same rows as the hold mode
    batch = next(iter(dm.train_dataloader()))
    assert batch["states"].shape[-1] == 32 and batch["targets"].shape[-1] == 10
    assert batch["mask"].shape == batch["targets"].shape and batch["shift"].shape == batch["row_valid"].shape


def _first_line_args(cfg: Path) -> list[str] | None:
    line = cfg.read_text().splitlines()[0]
    assert line.startswith("# ") and "python" in line, f"{cfg}: first line must be the command that runs it"
    tokens = shlex.split(line[2:].split("&&")[-1].split("(")[0])
    if "train.py" not in tokens:
        return None
    args = tokens[tokens.index("train.py") + 1:]
    return [str(ROOT / a) if a.startswith("configs/") else a for a in args]


def test_every_fit_config_instantiates():
    configs = sorted((ROOT / "configs/fit").glob("*.yaml"))
    assert {c.name for c in configs} >= {"turn_head.yaml", "turn_head_demo.yaml"}
    for cfg in configs:
        args = _first_line_args(cfg)
        if args is None:
            continue
        cli = cli_main([a for a in args if a not in ("fit", "validate", "test")], run=False)  # run=False: no subcommand
        assert cli.model is not None and cli.datamodule is not None and cli.trainer is not None


def test_every_sweep_parameter_parses():
    sweeps = sorted((ROOT / "configs/sweeps").glob("*.yaml"))
    assert sweeps
    for path in sweeps:
        sweep = yaml.safe_load(path.read_text())
        assert sweep["program"] == "train.py" and "${args}" in sweep["command"]
        cmd = sweep["command"]
        base = [str(ROOT / a) if a.startswith("configs/") else a for a in cmd[cmd.index("${program}") + 1:]
                if a not in ("${args}", "fit")]  # run=False: no subcommand
        params = {k: (v["values"] if "values" in v else [v["min"], v["max"]]) for k, v in sweep["parameters"].items()}
        for j in range(max(len(v) for v in params.values())):
            chosen = {k: v[j % len(v)] for k, v in params.items()}
            cli = cli_main(base + [f"--{k}={v}" for k, v in chosen.items()], run=False)  # W&B's ${args} format
            for k, v in chosen.items():
                assert cli.config[k] == v, (path.name, k)
            assert cli.model.hparams.head_type in ("linear", "mlp", "causal_conv", "causal_attention")
            assert cli.datamodule.hparams.expected_mode in MODES
