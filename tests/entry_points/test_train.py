"""train.py on synthetic cached features: learning, fail-closed checks, W&B offline, every fit/sweep config."""
import shlex
from pathlib import Path

import pytest
import torch
import yaml

from datamodules.features import FeatureFileError, feature_path, load_features, save_features
from datamodules.synthetic_turns import MODES, write_synthetic_dataset
from datamodules.turn_features import TurnFeatureDataModule
from train import cli_main, command_for_test

ROOT = Path(__file__).resolve().parents[2]
BASE = str(ROOT / "configs/fit/turn_head.yaml")
DEMO = str(ROOT / "configs/fit/turn_head_demo.yaml")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_synthetic_dataset(tmp_path_factory.mktemp("demo_turns"), num_sessions=12, duration_s=60.0, dim=32)


pytestmark = pytest.mark.usefixtures("train_env")   # tests/conftest.py: W&B offline, cwd in tmp_path


def fit_args(demo, tmp_path, *extra):
    return ["fit", "--config", BASE, "--config", DEMO, f"--data.init_args.features_dir={demo / 'features'}",
            f"--data.init_args.utterances_root={demo / 'transcripts'}", f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", *extra]


def test_fit_learns_logs_offline_and_tests_best_checkpoint(demo, tmp_path, capsys):
    cli = cli_main(fit_args(demo, tmp_path, "--trainer.max_epochs=3", f"--trainer.logger.init_args.save_dir={tmp_path}"))
    assert "anonymous" not in cli.trainer.logger._wandb_init       # wandb warns on every run when it is passed
    out = capsys.readouterr().out
    best = cli.trainer.checkpoint_callback
    epochs = [ln for ln in out.splitlines() if ln.startswith("epoch ")]
    assert len(epochs) == 3 and epochs[0].startswith("epoch 0/2: val/auroc_mean ")
    score = float(best.best_model_score)
    at = [int(ln.split("(best ")[1].split(" at epoch ")[1].rstrip(")").split(")")[0]) for ln in epochs][-1]
    assert f"(best {score:.4f} at epoch {at})" in epochs[-1]
    assert f"epoch {at}/2: val/auroc_mean {score:.4f}" in out                # the best epoch's own line
    assert f"best checkpoint (val/auroc_mean {score:.4f} at epoch {at}): {best.best_model_path}" in out
    args = fit_args(demo, tmp_path, "--trainer.max_epochs=3", f"--trainer.logger.init_args.save_dir={tmp_path}")
    assert f"test it: {command_for_test(args, best.best_model_path)}" in out
    m = cli.trainer.callback_metrics
    assert float(m["val/auroc_mean"]) > 0.9
    assert float(m["train/rows_per_s"]) > 0 and "val/sh_bacc" in m and "val/ap_va_wearer" in m
    assert cli.trainer.logger.experiment.settings.mode == "offline" or cli.trainer.logger._offline
    res = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False,
                           ckpt_path=cli.trainer.checkpoint_callback.best_model_path)[0]   # best.ckpt
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


def _first_line_args(cfg: Path) -> list[str]:
    """The ``train.py`` arguments of the command on ``cfg``'s first line (DESIGN §6: each YAML starts with the command
    that runs it); AssertionError when that line is not a ``python ... train.py`` command."""
    line = cfg.read_text().splitlines()[0]
    assert line.startswith("# ") and "python" in line, f"{cfg}: first line must be the command that runs it"
    tokens = shlex.split(line[2:].split("&&")[-1].split("(")[0])
    assert "train.py" in tokens, f"{cfg}: the first line has no train.py command: {line!r}"
    args = tokens[tokens.index("train.py") + 1:]
    return [str(ROOT / a) if a.startswith("configs/") else a for a in args]


def test_first_line_without_train_command_fails(tmp_path):
    cfg = tmp_path / "x.yaml"
    cfg.write_text("# python evaluate.py predict --config configs/extract/open_stream_replay.yaml\nmodel: {}\n")
    with pytest.raises(AssertionError, match="first line has no train.py command"):
        _first_line_args(cfg)
    cfg.write_text("model: {}\n")
    with pytest.raises(AssertionError, match="first line must be the command"):
        _first_line_args(cfg)
    assert _first_line_args(ROOT / "configs/fit/turn_head_demo.yaml") == [
        "fit", "--config", BASE, "--config", DEMO]   # the part after ``&&``


def _merged_yaml(paths: list[str]) -> dict:
    """model / data ``class_path`` and ``init_args`` of stacked ``--config`` files, later files overriding keys."""
    out = {"model": {"init_args": {}}, "data": {"init_args": {}}}
    for path in paths:
        cfg = yaml.safe_load(Path(path).read_text())
        for part in ("model", "data"):
            if part in cfg:
                out[part]["class_path"] = cfg[part].get("class_path", out[part].get("class_path"))
                out[part]["init_args"].update(cfg[part].get("init_args", {}))
    return out


def test_every_fit_config_instantiates():
    configs = sorted((ROOT / "configs/fit").glob("*.yaml"))
    assert {c.name for c in configs} >= {"turn_head.yaml", "turn_head_demo.yaml"}
    for cfg in configs:
        args = _first_line_args(cfg)
        assert args[0] == "fit" and str(cfg) in args, (cfg.name, args)
        cli = cli_main([a for a in args if a not in ("fit", "validate", "test")], run=False)  # run=False: no subcommand
        want = _merged_yaml([args[i + 1] for i, a in enumerate(args) if a == "--config"])
        for part, obj in (("model", cli.model), ("data", cli.datamodule)):
            assert f"{type(obj).__module__}.{type(obj).__qualname__}" == want[part]["class_path"], (cfg.name, part)
        assert want["model"]["init_args"] and want["data"]["init_args"]
        for key, value in want["model"]["init_args"].items():
            assert cli.model.hparams[key] == value, (cfg.name, key)
        for key, value in want["data"]["init_args"].items():
            got = cli.datamodule.hparams[key]
            assert (list(got) if isinstance(got, (list, tuple)) else got) == value, (cfg.name, key)
        assert cli.datamodule.splits == {"train": want["data"]["init_args"]["train_sessions"],
                                         "val": want["data"]["init_args"]["val_sessions"],
                                         "test": want["data"]["init_args"]["test_sessions"]}
        epochs = [yaml.safe_load(Path(args[i + 1]).read_text()).get("trainer", {}).get("max_epochs")
                  for i, a in enumerate(args) if a == "--config"]
        assert cli.trainer.max_epochs == [e for e in epochs if e is not None][-1]


def test_turn_head_yaml_is_the_runbook_recipe(demo):
    """Seed 002: ``train_turn_head.py ... --epochs 50 --batch-size 512``: 50 epochs, batches of 512 scored feature
    rows (each item one row plus its causal warm-up rows), no early stopping unless a YAML adds it."""
    from lightning.pytorch.callbacks import EarlyStopping

    cli = cli_main(["--config", BASE, f"--data.init_args.features_dir={demo / 'features'}",
                    f"--data.init_args.utterances_root={demo / 'transcripts'}",
                    "--data.init_args.utterances_loader=datamodules.turn_features.load_utterances_json"], run=False)
    assert cli.trainer.max_epochs == 50
    assert not any(isinstance(c, EarlyStopping) for c in cli.trainer.callbacks)
    hp = cli.datamodule.hparams
    assert (hp.batch_size, hp.chunk_rows, hp.warmup_rows) == (512, 1, 10)
    # seed 002:58: excluding initialization rows is a sensitivity analysis, a config of its own; the recipe keeps them
    assert hp.initialization_rows == "keep"
    ex = cli_main(["--config", BASE, "--config", str(ROOT / "configs/fit/turn_head_exclude_init.yaml")], run=False)
    assert ex.datamodule.hparams.initialization_rows == "exclude_any_mode"
    cli.datamodule.setup("fit")
    batch = next(iter(cli.datamodule.train_dataloader()))
    assert batch["states"].shape[0] == 512 and batch["states"].shape[1] <= 11
    assert int(batch["row_valid"].sum(dim=1).max()) == 1   # one scored row per item: 512 rows per batch at most
    es = ROOT / "configs/fit/turn_head_early_stopping.yaml"
    cli = cli_main(["--config", BASE, "--config", str(es)], run=False)
    stops = [c for c in cli.trainer.callbacks if isinstance(c, EarlyStopping)]
    assert len(stops) == 1 and stops[0].monitor == "val/auroc_mean" and stops[0].patience == 5
    assert cli.trainer.checkpoint_callback.monitor == "val/auroc_mean"


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


def _copy_features(demo, tmp_path, edit):
    """A copy of the demo features folder where ``edit(session, mode, tensors, meta)`` may change each file."""
    out = tmp_path / "features"
    out.mkdir(parents=True)
    for f in sorted((demo / "features").glob("*.safetensors")):
        tensors, meta = load_features(f)
        session, mode = f.name.split(".")[:2]
        edit(session, mode, tensors, meta)
        save_features(out / f.name, tensors, meta)
    return out


def test_negative_expected_layer_resolves_with_the_files_depth(demo, tmp_path):
    """Extracted files record the resolved layer and the thinker depth: ``expected_layer: -1`` (as in the extract
    configs) matches layer = num_layers; another layer fails closed naming the file."""
    def resolved(session, mode, tensors, meta):
        meta.update(layer=1 if session == "Session_5" else 24, num_layers=24)

    feats = _copy_features(demo, tmp_path, resolved)
    kw = dict(features_dir=str(feats), utterances_root=str(demo / "transcripts"),
              utterances_loader="datamodules.turn_features.load_utterances_json", expected_mode="completed-block-hold")
    with pytest.raises(FeatureFileError, match=r"Session_5\.completed-block-hold\.safetensors.*layer: expected 24, "
                                               r"file has 1"):
        TurnFeatureDataModule(expected_layer=-1, **kw).load()
    ok = TurnFeatureDataModule(expected_layer=-1, train_sessions=[1, 2], val_sessions=[3], test_sessions=[4], **kw)
    assert ok.load() and ok.layer == 24

    def older(session, mode, tensors, meta):  # resolved layer, no num_layers: -1 cannot be checked, say so
        meta.update(layer=24)

    kw["features_dir"] = str(_copy_features(demo, tmp_path / "older", older))
    with pytest.raises(FeatureFileError, match=r"expected_layer=-1 counts from the end, but this file records layer 24 "
                                               r"without num_layers"):
        TurnFeatureDataModule(expected_layer=-1, **kw).load()


def test_splits_without_counted_rows_and_one_row_standardization_fail_closed(demo, tmp_path):
    """A split whose rows are all initialization rows, or a train split with < 2 rows to standardize on, is an
    error naming the folder and sessions (it used to give a torchmetrics IndexError / a NaN loss)."""
    def all_init(session, mode, tensors, meta):
        if session in ("Session_2", "Session_3"):
            tensors["initialization_mask"][:] = 1
            if session == "Session_3":
                tensors["initialization_mask"][-1] = 0   # one row left

    feats = _copy_features(demo, tmp_path, all_init)
    kw = dict(features_dir=str(feats), utterances_root=str(demo / "transcripts"),
              utterances_loader="datamodules.turn_features.load_utterances_json", expected_mode="completed-block-hold",
              initialization_rows="exclude", expected_layer=-1)
    with pytest.raises(FeatureFileError, match=r"the val split \(sessions \['Session_2'\]\) has no row that counts"):
        TurnFeatureDataModule(train_sessions=[1], val_sessions=[2], test_sessions=[4], **kw).load()
    with pytest.raises(FeatureFileError, match=r"standardize needs at least 2 train rows .* has 1"):
        TurnFeatureDataModule(train_sessions=[3], val_sessions=[1], test_sessions=[4], **kw).load()


def test_other_mode_files_are_checked_too(demo, tmp_path):
    """``exclude_any_mode`` reads the other modes' files: their metadata must match the run as well."""
    def other_memory(session, mode, tensors, meta):
        if mode == "micro-chunk-200ms" and session == "Session_1":
            meta["memory_s"] = 4.0

    feats = _copy_features(demo, tmp_path, other_memory)
    dm = TurnFeatureDataModule(features_dir=str(feats), utterances_root=str(demo / "transcripts"),
                               utterances_loader="datamodules.turn_features.load_utterances_json",
                               expected_mode="completed-block-hold", initialization_rows="exclude_any_mode",
                               expected_layer=-1)
    with pytest.raises(FeatureFileError, match=r"Session_1\.micro-chunk-200ms\.safetensors.*memory_s"):
        dm.load()


def test_failed_extractions_and_non_finite_states_are_named(demo, tmp_path):
    """Training and extraction failures meet: a missing session whose extraction failed names its own
    ``.error.json`` (not another session's or policy's), ``exclude_any_mode`` names the other mode's error file,
    features with NaN states are refused naming the file, and features kept beside a later failure load with a
    warning."""
    import json

    from datamodules.features import error_path

    def nan_states(session, mode, tensors, meta):
        if session == "Session_5" and mode == "completed-block-hold":
            tensors["states"][3, 0] = float("nan")

    feats = _copy_features(demo, tmp_path, nan_states)
    kw = dict(features_dir=str(feats), utterances_root=str(demo / "transcripts"),
              utterances_loader="datamodules.turn_features.load_utterances_json", expected_mode="completed-block-hold",
              initialization_rows="exclude", expected_layer=-1)

    def failed(session, mode, policy="window"):
        path = error_path(feature_path(feats, session, mode, policy))
        path.write_text(json.dumps({"session": session, "mode": mode, "error": "x.mp4: bad"}))
        return path

    feature_path(feats, "Session_2", "completed-block-hold").unlink()
    failed("Session_2", "completed-block-hold")
    failed("Session_7", "completed-block-hold", "sliding")                 # another policy: not named
    failed("Session_8", "completed-block-hold")                            # another session: not named
    with pytest.raises(FeatureFileError, match=r"sessions \[2\] \(their extraction failed: see "
                                               r"Session_2\.completed-block-hold\.error\.json\)$"):
        TurnFeatureDataModule(train_sessions=[1], val_sessions=[2], test_sessions=[4], **kw).load()
    with pytest.raises(FeatureFileError, match=r"Session_5\.completed-block-hold\.safetensors: 1 rows of states are "
                                               r"NaN or infinite"):
        TurnFeatureDataModule(train_sessions=[5], val_sessions=[1], test_sessions=[4], **kw).load()
    with pytest.warns(UserWarning, match=r"Session_8\.completed-block-hold\.safetensors: a later extraction of "
                                         r"Session_8 failed"):
        TurnFeatureDataModule(train_sessions=[8], val_sessions=[1], test_sessions=[4], **kw).load()
    feature_path(feats, "Session_1", "micro-chunk-200ms").unlink()
    failed("Session_1", "micro-chunk-200ms")
    with pytest.raises(FeatureFileError, match=r"needs this file .*its extraction failed: see "
                                               r"Session_1\.micro-chunk-200ms\.error\.json"):
        TurnFeatureDataModule(train_sessions=[1], val_sessions=[4], test_sessions=[6],
                              **{**kw, "initialization_rows": "exclude_any_mode"}).load()


def test_extracted_features_train_with_the_shipped_fit_config(tmp_path):
    """The researcher's path end to end: EasyCom-layout media -> ``evaluate.py predict`` with the three shipped
    extract configs (tiny thinker) -> ``train.py fit`` / ``test`` with the shipped ``turn_head.yaml``, changing only
    folders, sessions and epochs (the extractor's resolved layer, policy and metadata must satisfy the training
    checks as shipped)."""
    from datamodules.easycom_fixture import build_easycom_fixture
    from evaluate import cli_main as predict_main
    from models.omni.tiny import build_tiny_omni

    model = tmp_path / "tiny_omni"
    build_tiny_omni(model)
    clip = [("00-00-000", "cockatoo.mp4", 0.0, 4.0, "realshort.mp4")]
    root = build_easycom_fixture(tmp_path / "ec", width=160, height=90,
                                 sessions={f"Session_{n}": clip for n in (1, 2, 3)})
    feats = tmp_path / "feats"
    for cfg in ("completed_block_hold", "micro_chunk_200ms", "open_stream_replay"):
        predict_main(["predict", "--config", str(ROOT / "configs/extract" / f"{cfg}.yaml"),
                      f"--model.init_args.model_dir={model}", f"--data.init_args.root={root}",
                      "--data.init_args.num_workers=0", "--data.init_args.frame_height=56",
                      "--data.init_args.frame_width=96", f"--trainer.callbacks.init_args.out_dir={feats}"])
    assert len(list(feats.glob("Session_*.safetensors"))) == 9
    # the sensitivity config (initialization rows excluded in any mode) on top of the recipe: reads all three modes
    common = ["--config", BASE, "--config", str(ROOT / "configs/fit/turn_head_exclude_init.yaml"),
              f"--data.init_args.features_dir={feats}", f"--data.init_args.utterances_root={root}",
              "--data.init_args.expected_mode=completed-block-hold", "--data.init_args.train_sessions=[1]",
              "--data.init_args.val_sessions=[2]", "--data.init_args.test_sessions=[3]",
              f"--trainer.default_root_dir={tmp_path / 'runs'}", "--trainer.logger=false",
              "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    cli = cli_main(["fit", *common, "--trainer.max_epochs=2"])
    dm = cli.datamodule
    assert dm.layer == 2 and dm.feature_dim == 32                      # layer -1 of the 2-layer tiny thinker (D=32)
    assert all(not s.row_valid[:9].any() and s.row_valid[9:].all() for s in dm.data["train"])  # first block held
    loss = cli.trainer.callback_metrics["train/loss"]
    assert torch.isfinite(loss)
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    out = cli_main(["test", *common, f"--ckpt_path={ckpt}"]).trainer.callback_metrics
    assert "test/auroc_mean" in out and torch.isfinite(out["test/auroc_mean"])


def test_per_target_metrics_equal_torchmetrics_multilabel():
    """The per-target binary metrics give exactly torchmetrics' multilabel average=None values (ignore_index=-1);
    a target with no counted row is NaN instead of an error."""
    from torchmetrics.classification import MultilabelAUROC, MultilabelAveragePrecision

    from algorithms.turn_targets import NUM_TARGETS
    from lightning_modules.turn_head import TurnHead

    torch.manual_seed(0)
    probs = torch.rand(200, NUM_TARGETS)
    tgt = (torch.rand(200, NUM_TARGETS) > 0.6).long()
    tgt[torch.rand(200, NUM_TARGETS) > 0.8] = -1
    m = TurnHead._stage_metrics()["labels"]
    m.update(probs, tgt)
    out = m.compute()
    ref = MultilabelAUROC(NUM_TARGETS, average=None, ignore_index=-1)(probs, tgt)
    assert torch.allclose(out["auroc"], ref)
    assert torch.allclose(out["ap"], MultilabelAveragePrecision(NUM_TARGETS, average=None, ignore_index=-1)(probs, tgt))
    # target 3 with no counted row: NaN there, the others unchanged (torchmetrics alone raises IndexError)
    tgt[:, 3] = -1
    m.reset()
    m.update(probs, tgt)
    out = m.compute()
    assert torch.isnan(out["auroc"][3]) and torch.isnan(out["ap"][3])
    keep = [j for j in range(NUM_TARGETS) if j != 3]
    assert torch.allclose(out["auroc"][keep], ref[keep])
    with pytest.raises(IndexError):
        MultilabelAUROC(NUM_TARGETS, average=None, ignore_index=-1)(probs, tgt)


def test_test_pr_curves_are_bounded_and_match_binary_curves():
    """The test PR curves come from fixed-threshold counters (memory independent of N) and equal torchmetrics'
    binary curve with the same 101 thresholds per target; a one-class target is left out."""
    from torchmetrics.functional.classification import binary_precision_recall_curve

    from algorithms.turn_targets import NUM_TARGETS, target_names
    from lightning_modules.turn_head import PR_THRESHOLDS, TurnHead

    torch.manual_seed(1)
    probs = torch.rand(300, NUM_TARGETS)
    tgt = (torch.rand(300, NUM_TARGETS) > 0.5).long()
    tgt[torch.rand(300, NUM_TARGETS) > 0.7] = -1
    tgt[:, 5] = torch.where(tgt[:, 5] >= 0, 0, -1)       # target 5: negatives only
    module = TurnHead(head_type="linear", in_dim=3)
    size = module.pr_curve.confmat.numel()
    for chunk in range(3):
        module.pr_curve.update(probs[chunk * 100:(chunk + 1) * 100], tgt[chunk * 100:(chunk + 1) * 100])
    assert module.pr_curve.confmat.numel() == size == PR_THRESHOLDS * NUM_TARGETS * 4
    rows = module.pr_curve_rows()
    names = target_names()
    assert {r[0] for r in rows} == set(names) - {names[5]}
    p, r, _ = binary_precision_recall_curve(probs[:, 0], tgt[:, 0], thresholds=PR_THRESHOLDS, ignore_index=-1)
    got = [row for row in rows if row[0] == names[0]]
    assert len(got) == PR_THRESHOLDS + 1
    assert torch.allclose(torch.tensor([g[1] for g in got]), r)
    assert torch.allclose(torch.tensor([g[2] for g in got]), p, equal_nan=True)


# ---------------------------------------------------------------- issue 23: runs that keep their results
def _csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _epoch_values(rows: list[dict[str, str]], key: str) -> dict[int, float]:
    return {int(r["epoch"]): float(r[key]) for r in rows if r.get(key)}


def test_disabled_wandb_fit_keeps_metrics_csv_and_resume_keeps_run_and_best(demo, tmp_path, monkeypatch):
    """``WANDB_MODE=disabled``: ``metrics.csv`` in the run folder (beside ``checkpoints/``) holds one
    ``train/loss`` and one ``val/auroc_mean`` per epoch, equal to the trainer's values; a resume from
    ``last.ckpt`` continues the same run folder / W&B id, restores ModelCheckpoint's best score before training
    (Lightning drops it when the folder changes) and appends to ``metrics.csv``."""
    import json

    from lightning_modules.turn_head import TurnHead

    monkeypatch.setenv("WANDB_MODE", "disabled")
    log = [f"--trainer.logger.init_args.save_dir={tmp_path}"]   # turn_head.yaml has no early stopping (seed 002)
    cli = cli_main(fit_args(demo, tmp_path, "--trainer.max_epochs=2", *log))
    ckpt = cli.trainer.checkpoint_callback
    run_dir = Path(ckpt.dirpath).parent
    run_id = json.loads((run_dir / "run_info.json").read_text())["id"]
    assert run_dir.name == run_id and run_dir.parent.name == "turn-heads-demo"
    rows = _csv_rows(run_dir / "metrics.csv")
    val, loss = _epoch_values(rows, "val/auroc_mean"), _epoch_values(rows, "train/loss")
    assert sorted(val) == sorted(loss) == [0, 1]
    assert val[1] == pytest.approx(float(cli.trainer.callback_metrics["val/auroc_mean"]), abs=1e-6)
    assert loss[1] == pytest.approx(float(cli.trainer.callback_metrics["train/loss"]), abs=1e-6)
    assert float(ckpt.best_model_score) == pytest.approx(max(val.values()), abs=1e-6)
    best_before, best_path = float(ckpt.best_model_score), ckpt.best_model_path
    # demo fit: 3 steps an epoch, log_every_n_steps 1 -> train/loss_step rows within every epoch (Lightning writes
    # the epoch's last step with the epoch-end row), not once in 15 steps
    step_rows = [r for r in rows if r.get("train/loss_step")]
    assert [int(r["epoch"]) for r in step_rows].count(0) >= 2 and [int(r["epoch"]) for r in step_rows].count(1) >= 2

    restored = []
    monkeypatch.setattr(TurnHead, "on_train_start", lambda self: restored.append(
        (self.trainer.checkpoint_callback.best_model_score, self.trainer.checkpoint_callback.best_model_path)))
    cli2 = cli_main(fit_args(demo, tmp_path, "--trainer.max_epochs=3", *log,
                             f"--ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"))
    assert float(restored[0][0]) == pytest.approx(best_before) and restored[0][1] == best_path
    ckpt2 = cli2.trainer.checkpoint_callback
    assert Path(ckpt2.dirpath).parent == run_dir and cli2.trainer.logger.version == run_id
    val2 = _epoch_values(_csv_rows(run_dir / "metrics.csv"), "val/auroc_mean")
    assert sorted(val2) == [0, 1, 2] and val2[0] == val[0] and val2[1] == val[1]
    assert float(ckpt2.best_model_score) == pytest.approx(max(val2.values()), abs=1e-6)


def test_last_ckpt_is_the_last_finished_epoch_not_the_best(demo, tmp_path, monkeypatch):
    """A fit whose score stops improving (lr 0: the weights and so val/auroc_mean never change after epoch 0):
    ``best.ckpt`` stays at epoch 0 and ``last.ckpt`` holds the last finished epoch, 2 (with ``save_last`` lightning
    2.6 left it at the best epoch, so a resume re-trained the epochs after it); the Ctrl-C note names it."""
    import torch

    from callbacks.train_console import last_checkpoint

    monkeypatch.setenv("WANDB_MODE", "disabled")
    cli = cli_main(fit_args(demo, tmp_path, "--trainer.max_epochs=3", "--model.init_args.lr=0",
                            f"--trainer.logger.init_args.save_dir={tmp_path}"))
    folder = Path(cli.trainer.checkpoint_callback.dirpath)
    assert sorted(p.name for p in folder.iterdir()) == ["best.ckpt", "last.ckpt"]
    assert torch.load(folder / "best.ckpt", weights_only=True)["epoch"] == 0
    assert torch.load(folder / "last.ckpt", weights_only=True)["epoch"] == 2
    assert last_checkpoint(cli.trainer) == str(folder / "last.ckpt")


def test_test_run_joins_the_fit_group(demo, tmp_path, capsys):
    """``train.py test`` of a run folder's checkpoint: a new W&B run (offline here) in the fit's group, job type
    ``test``; the fit is its own group when none is given; the console names the test's own run folder."""
    import json
    import warnings

    import wandb

    wandb.finish()   # a run left open by an earlier test of this process would be reused
    log = f"--trainer.logger.init_args.save_dir={tmp_path}"
    fit = cli_main(fit_args(demo, tmp_path, "--trainer.max_epochs=1", log))
    info = json.loads((Path(fit.trainer.checkpoint_callback.dirpath).parent / "run_info.json").read_text())
    assert info["group"] == info["id"] == fit.trainer.logger.version
    wandb.finish()   # one process here: a new WandbLogger would otherwise reuse the fit's run
    args = [a for a in fit_args(demo, tmp_path, log) if a != "fit"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        test = cli_main(["test", *args, f"--ckpt_path={fit.trainer.checkpoint_callback.best_model_path}"])
    # no Lightning "dirpath has changed" warning on the console (a7fdaaf printed it; pyproject filters it for tests)
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    lg = test.trainer.logger
    assert lg.version != info["id"]
    assert lg._wandb_init["group"] == info["id"] and lg._wandb_init["job_type"] == "test"
    assert lg.experiment.group == info["id"] and lg.experiment.job_type == "test"
    assert "test/auroc_mean" in test.trainer.callback_metrics
    folder = tmp_path / str(lg.name) / str(lg.version)
    # the line names the files the test wrote: metrics.csv (run_info.json is a fit's; a7fdaaf named it here too)
    assert f"test results: {folder} (metrics.csv)\n" in capsys.readouterr().out
    assert (folder / "metrics.csv").is_file() and not (folder / "run_info.json").exists()


def test_monitored_metric_summary_is_its_best():
    """``WandbSummaryMetric`` defines the checkpoint's monitor with ``summary=max`` (``min`` for mode min), on every
    W&B logger only."""
    from types import SimpleNamespace

    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    from train import WandbSummaryMetric

    calls = []
    fake = SimpleNamespace(define_metric=lambda name, **kw: calls.append((name, kw)))
    for mode, want in (("max", "max"), ("min", "min")):
        calls.clear()
        trainer = SimpleNamespace(checkpoint_callback=SimpleNamespace(monitor="val/auroc_mean", mode=mode),
                                  loggers=[WandbLogger(experiment=fake), CSVLogger("unused")])
        WandbSummaryMetric().on_fit_start(trainer, None)
        assert calls == [("val/auroc_mean", {"summary": want})]


def test_string_choices_fail_at_parse_time_and_are_listed(capsys):
    """Head type, streaming mode, memory policy and initialization rows are ``Literal`` choices: ``--help`` lists
    them and a typo is refused while parsing, naming the value."""
    with pytest.raises(SystemExit):
        cli_main(["--config", BASE, "--config", DEMO, "--model.init_args.head_type=causal_cnov"], run=False)
    assert "causal_cnov" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["--config", BASE, "--config", DEMO, "--data.init_args.expected_mode=open-stream"], run=False)
    assert "open-stream" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["fit", "--config", BASE, "--model.help", "lightning_modules.turn_head.TurnHead"])
    out = capsys.readouterr().out
    assert all(k in out for k in ("linear", "mlp", "causal_conv", "causal_attention"))
    with pytest.raises(SystemExit):
        cli_main(["fit", "--config", BASE, "--data.help", "datamodules.turn_features.TurnFeatureDataModule"])
    out = capsys.readouterr().out
    assert all(k in out for k in ("completed-block-hold", "micro-chunk-200ms", "exclude_any_mode", "sliding"))


def test_compare_turn_modes_keeps_results_and_removes_checkpoints(demo, tmp_path):
    """``bench/compare_turn_modes.py`` writes ``results.md`` / ``.csv`` / ``.json`` into its run folder, keeps each
    run's ``metrics.csv`` and deletes the checkpoints."""
    import json
    import sys as _sys

    _sys.path.insert(0, str(ROOT / "bench"))
    import compare_turn_modes

    out = tmp_path / "cmp"
    table = compare_turn_modes.main([
        "--config", BASE, "--config", DEMO, "--modes", "completed-block-hold", "--seeds", "0", "1", "--out", str(out),
        "--extra", f"--data.init_args.features_dir={demo / 'features'}",
        f"--data.init_args.utterances_root={demo / 'transcripts'}", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"])
    assert (out / "results.md").read_text().strip() == table
    rows = _csv_rows(out / "results.csv")
    assert [(r["mode"], r["seed"]) for r in rows] == [("completed-block-hold", "0"), ("completed-block-hold", "1")]
    res = json.loads((out / "results.json").read_text())
    assert [float(r["auroc_mean"]) for r in rows] == [r["auroc_mean"] for r in res["completed-block-hold"]]
    assert not list(out.rglob("*.ckpt")) and len(list(out.rglob("metrics.csv"))) == 2


# ---------------------------------------------------------------- issue 34.1: test is not killed out of memory
def test_binned_pr_curve_counts_equal_torchmetrics_and_ignore_the_deterministic_flag():
    """The PR-curve counters equal torchmetrics' own multilabel update (its ``torch.bincount`` path) on probabilities
    and on logits, with ignored entries and over several updates, and are the same with deterministic algorithms on
    (where torchmetrics' update would build an (N L T) x (4 L T) matrix)."""
    from torchmetrics.classification import MultilabelPrecisionRecallCurve

    from lightning_modules.turn_head import BinnedMultilabelPrecisionRecallCurve

    torch.manual_seed(3)
    for scale in (1.0, 6.0):                                  # 6.0: logits outside [0, 1] -> sigmoid first
        preds = torch.rand(2, 257, 10) if scale == 1.0 else torch.randn(2, 257, 10) * scale
        tgt = (torch.rand(2, 257, 10) > 0.6).long()
        tgt[torch.rand(2, 257, 10) > 0.8] = -1
        ref = MultilabelPrecisionRecallCurve(10, thresholds=101, ignore_index=-1)   # torch.bincount path
        ours = BinnedMultilabelPrecisionRecallCurve(10, thresholds=101, ignore_index=-1)
        ours.chunk_rows = 100                                 # several chunks per update
        torch.use_deterministic_algorithms(False)     # (the conftest fixture restores the flag)
        for k in range(2):
            ref.update(preds[k], tgt[k])
            ours.update(preds[k], tgt[k])
        assert torch.equal(ours.confmat, ref.confmat)
        assert int(ours.confmat[0].sum()) == int((tgt >= 0).sum())   # each counted entry once per threshold
        det = BinnedMultilabelPrecisionRecallCurve(10, thresholds=101, ignore_index=-1)
        torch.use_deterministic_algorithms(True)
        for k in range(2):
            det.update(preds[k], tgt[k])
        torch.use_deterministic_algorithms(False)
        assert torch.equal(det.confmat, ref.confmat)
        for a, b in zip(det.compute(), ref.compute()):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


_FIT_THEN_TEST = """
import resource, sys
from pathlib import Path
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
from train import cli_main, command_for_test
base, demo, out = sys.argv[2], Path(sys.argv[3]), sys.argv[4]
data = [f"--data.init_args.features_dir={demo / 'features'}", f"--data.init_args.utterances_root={demo / 'transcripts'}",
        "--data.init_args.utterances_loader=datamodules.turn_features.load_utterances_json",
        f"--trainer.default_root_dir={out}", f"--trainer.logger.init_args.save_dir={out}",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
cli = cli_main(["fit", "--config", base, *data, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"])
best = cli.trainer.checkpoint_callback.best_model_path
cli = cli_main(["test", "--config", base, *data, f"--ckpt_path={best}"])
print("TEST", float(cli.trainer.callback_metrics["test/auroc_mean"]))
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]   # this process's peak RSS (kB)
print("PEAK_MB", int(hwm.split()[1]) // 1024)
"""


def test_fit_then_test_under_the_shipped_recipe_stays_in_bounded_memory(demo, tmp_path):
    """``train.py fit`` then ``train.py test`` with ``configs/fit/turn_head.yaml`` as shipped (``deterministic: true``,
    batches of 512 rows) in a process whose data segment is limited to 3 GiB (peak RSS under 2 GiB): torchmetrics' deterministic bincount
    needed ~17 GB per 512-row test batch and was killed (issue 34.1). W&B disabled (its own process is not measured)."""
    import os
    import subprocess
    import sys as _sys

    env = {**os.environ, "WANDB_MODE": "disabled", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("WANDB_API_KEY", None)
    with open(BASE) as f:
        assert yaml.safe_load(f)["trainer"]["deterministic"] is True          # the case of the issue is the shipped one
    res = subprocess.run([_sys.executable, "-c", _FIT_THEN_TEST, str(3 << 30), BASE, str(demo), str(tmp_path / "runs")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    peak = int(res.stdout.split("PEAK_MB")[1].split()[0])
    assert peak < 2048, peak
    assert 0.0 <= float(res.stdout.split("TEST")[1].split()[0]) <= 1.0


# ---------------------------------------------------------------- issue 34.4: the training console
def test_test_command_keeps_the_fit_arguments():
    assert command_for_test(["fit", "--config", "a b.yaml", "--ckpt_path", "old.ckpt", "--trainer.max_epochs=3"],
                            "r/best.ckpt") == ("python train.py test --config 'a b.yaml' --trainer.max_epochs=3 "
                                               "--ckpt_path=r/best.ckpt")
    assert command_for_test(["fit", "--ckpt_path=x.ckpt"], "y.ckpt") == "python train.py test --ckpt_path=y.ckpt"


def test_a_failing_fit_leaves_no_wandb_run_and_no_run_folder(demo, tmp_path):
    """Missing features (stopped before the run starts) and a head of the wrong size (stopped at fit start, after the
    W&B run exists) leave neither the W&B offline run nor the run folder; the save_dir that existed stays."""
    runs = tmp_path / "runs"
    wandb_on = [f"--trainer.logger.init_args.save_dir={runs}"]
    with pytest.raises(FeatureFileError):
        cli_main(fit_args(demo, tmp_path, *wandb_on, f"--data.init_args.features_dir={tmp_path / 'nowhere'}"))
    assert not runs.exists()
    runs.mkdir()
    (runs / "keep.txt").write_text("x")
    with pytest.raises(Exception, match="the head takes features of size D=5"):
        cli_main(fit_args(demo, tmp_path, *wandb_on, "--model.init_args.in_dim=5"))
    assert sorted(p.name for p in runs.iterdir()) == ["keep.txt"]
    # a fit that trains keeps its run folder and W&B files
    cli = cli_main(fit_args(demo, tmp_path, *wandb_on, "--trainer.max_epochs=1"))
    run_dir = runs / cli.trainer.logger.name / cli.trainer.logger.version
    assert (run_dir / "checkpoints" / "best.ckpt").is_file() and list((runs / "wandb").glob("offline-run-*"))


def test_abbreviated_options_are_refused(demo, tmp_path, capsys):
    """``--trainer.max_epoch 1`` was taken for ``--trainer.max_epochs`` (argparse's prefix matching): refused now,
    naming the option it resembles, before anything runs."""
    with pytest.raises(SystemExit) as info:
        cli_main(fit_args(demo, tmp_path, "--trainer.max_epoch", "1"))
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: unrecognized arguments: --trainer.max_epoch 1; did you mean '--trainer.max_epochs'?")
    assert not list(tmp_path.rglob("*.ckpt")) and not list(tmp_path.rglob("metrics.csv"))
