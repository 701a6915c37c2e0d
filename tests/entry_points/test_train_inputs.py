"""Bad inputs of the turn-head training path fail closed with one line naming the file, session, split or setting
(a new-user trial): transcripts (missing root / session folder / files, a JSON object without a list, a session
without utterances, a wearer id that never speaks, an utterance ending before it starts), ``train.py test`` without
``--ckpt_path``, a truncated checkpoint, a checkpoint of another feature size D, empty splits, and non-positive
integer settings."""
import json
from pathlib import Path

import pytest

from algorithms.errors import CheckpointError, SettingError
from datamodules.easycom import EasyComFormatError, load_session_utterances
from datamodules.features import FeatureFileError
from datamodules.synthetic_turns import write_synthetic_dataset
from datamodules.turn_features import TurnFeatureDataModule, load_utterances_json
from lightning_modules.turn_head import TurnHead
from cli import check_checkpoint_file, ckpt_path_arg
from train import cli_main

ROOT = Path(__file__).resolve().parents[2]
BASE = str(ROOT / "configs/fit/turn_head.yaml")
DEMO = str(ROOT / "configs/fit/turn_head_demo.yaml")
TRANSCRIPTS = "Main/Speech_Transcriptions"


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """3 sessions x 3 modes, 10 s, D = 8 (seed 0: participants [1, 2], [1, 2, 3], [2])."""
    return write_synthetic_dataset(tmp_path_factory.mktemp("inputs_turns"), num_sessions=3, duration_s=10.0, dim=8)


pytestmark = pytest.mark.usefixtures("train_env")   # tests/conftest.py: W&B offline, cwd in tmp_path


def _dm(synth, **kw) -> TurnFeatureDataModule:
    args = dict(features_dir=str(synth / "features"), expected_mode="open-stream-replay",
                utterances_root=str(synth / "transcripts"),
                utterances_loader="datamodules.turn_features.load_utterances_json", expected_layer=-1,
                train_sessions=[1], val_sessions=[2], test_sessions=[3])
    return TurnFeatureDataModule(**{**args, **kw})


def _easycom(root: Path, sessions=(1, 2, 3), content=None) -> Path:
    """EasyCom transcript tree: one ``00-00-000.json`` per session (participants 2 and 3 unless ``content``)."""
    utts = [{"Start_Frame": 4, "End_Frame": 30, "Participant_ID": 2, "Transcription": "a"},
            {"Start_Frame": 34, "End_Frame": 70, "Participant_ID": 3, "Transcription": "b"}]
    for n in sessions:
        folder = root / TRANSCRIPTS / f"Session_{n}"
        folder.mkdir(parents=True)
        (folder / "00-00-000.json").write_text(json.dumps(utts) if content is None else content)
    return root


def _raises(exc_type, msg: str, fn, *args, **kwargs) -> None:
    with pytest.raises(exc_type) as e:
        fn(*args, **kwargs)
    assert str(e.value) == msg


# ------------------------------------------------------------------------------------------------ 1. transcripts
def test_wrong_transcripts_fail_naming_the_folder_file_or_session(synth, tmp_path):
    easy = dict(utterances_loader="datamodules.easycom.load_session_utterances")
    missing = tmp_path / "nonexistent"
    _raises(EasyComFormatError, f"{missing}: no such folder (expected the EasyCom root holding {TRANSCRIPTS})",
            _dm(synth, utterances_root=str(missing), **easy).load)
    root = _easycom(tmp_path / "no_s3", sessions=(1, 2))
    _raises(EasyComFormatError, f"{root / TRANSCRIPTS}/Session_3: transcript folder of Session_3 missing",
            _dm(synth, utterances_root=str(root), **easy).load)
    root = _easycom(tmp_path / "no_files")
    (root / TRANSCRIPTS / "Session_2/00-00-000.json").unlink()
    _raises(EasyComFormatError, f"{root / TRANSCRIPTS}/Session_2: no mm-ss-SSS.json transcripts",
            _dm(synth, utterances_root=str(root), **easy).load)
    root = _easycom(tmp_path / "dict", content='{"a": 1}')
    _raises(EasyComFormatError, f"{root / TRANSCRIPTS}/Session_1/00-00-000.json: expected a list of utterances, got an "
            "object without a list (keys ['a'])", _dm(synth, utterances_root=str(root), **easy).load)
    root = _easycom(tmp_path / "wrapped", content='{"utterances": [{"Start_Frame": 0, "End_Frame": 5, '
                                                  '"Participant_ID": 2}]}')
    assert [u.participant_id for u in load_session_utterances(root, "Session_1")] == [2]   # wrappers still read
    root = _easycom(tmp_path / "empty", content="[]")
    _raises(SettingError, f"{root}: Session_1 has no utterances (read by datamodules.easycom.load_session_utterances);"
            " check data.init_args.utterances_root", _dm(synth, utterances_root=str(root), **easy).load)
    root = _easycom(tmp_path / "ok")
    with pytest.raises(SettingError, match=r"^data.init_args.wearer_id=77 never occurs in the utterances "
                                           r"\(participant ids: Session_1 \[2, 3\], "):
        _dm(synth, utterances_root=str(root), wearer_id=77, **easy).load()
    assert _dm(synth, utterances_root=str(root), **easy).load()["test"][0].session == "Session_3"
    # the JSON loader (synthetic transcripts) too
    with pytest.raises(SettingError, match=r"^data.init_args.wearer_id=4 never occurs in the utterances "
                                           r"\(participant ids: Session_1 \[1, 2\], "):
        _dm(synth, wearer_id=4).load()
    _raises(FileNotFoundError, f"{missing}: utterances_root folder missing", load_utterances_json, missing, "Session_1")
    _raises(FileNotFoundError, f"{tmp_path}/Session_1.utterances.json: utterances file of Session_1 missing",
            load_utterances_json, tmp_path, "Session_1")
    (tmp_path / "Session_1.utterances.json").write_text('{"a": 1}')
    _raises(FeatureFileError, f"{tmp_path}/Session_1.utterances.json: expected a list of utterances, got dict",
            load_utterances_json, tmp_path, "Session_1")


# --------------------------------------------------------------------------------------- 6. utterance ends early
def test_utterance_ending_before_it_starts_names_file_and_index(tmp_path):
    bad = [{"Start_Frame": 4, "End_Frame": 30, "Participant_ID": 2},
           {"Start_Frame": 40, "End_Frame": 31, "Participant_ID": 3}]
    root = _easycom(tmp_path / "ec", sessions=(1,), content=json.dumps(bad))
    _raises(EasyComFormatError, f"{root / TRANSCRIPTS}/Session_1/00-00-000.json: utterance 1 ends before it starts "
            "(Start_Frame 40, End_Frame 31)", load_session_utterances, root, "Session_1")
    js = tmp_path / "Session_1.utterances.json"
    js.write_text(json.dumps([{"start_s": 1.0, "end_s": 2.0, "participant_id": 2},
                              {"start_s": 3.0, "end_s": 2.5, "participant_id": 1}]))
    _raises(FeatureFileError, f"{js}: utterance 1 ends before it starts (start_s 3.0, end_s 2.5)",
            load_utterances_json, tmp_path, "Session_1")


# ---------------------------------------------------------------------------------------------- 5. empty splits
def test_empty_splits_fail_at_setup_naming_the_split(synth):
    _raises(SettingError, "data.init_args.train_sessions is empty: fit needs at least one train session",
            _dm(synth, train_sessions=[]).setup, "fit")
    _raises(SettingError, "data.init_args.val_sessions is empty: fit needs at least one val session",
            _dm(synth, val_sessions=[]).setup, "fit")
    _raises(SettingError, "data.init_args.test_sessions is empty: test needs at least one test session",
            _dm(synth, test_sessions=[]).setup, "test")
    _raises(SettingError, "data.init_args.val_sessions is empty: validate needs at least one val session",
            _dm(synth, val_sessions=[]).setup, "validate")
    standardize = ("data.init_args.train_sessions is empty: standardize takes the feature mean/std from the train "
                   "sessions (in every stage)")
    _raises(SettingError, standardize, _dm(synth, train_sessions=[]).setup, "test")
    _raises(SettingError, standardize, _dm(synth, train_sessions=[]).load)
    _dm(synth, train_sessions=[], standardize=False).setup("test")      # nothing to standardize: fine
    _dm(synth, test_sessions=[]).setup("fit")                           # fit does not read the test split


# ------------------------------------------------------------------------------------ 7. integer settings at init
@pytest.mark.parametrize("name, value, low", [("chunk_rows", 0, 1), ("warmup_rows", -1, 0), ("batch_size", 0, 1),
                                              ("num_workers", -1, 0), ("chunk_rows", 2.5, 1)])
def test_datamodule_integer_settings(synth, name, value, low):
    _raises(SettingError, f"data.init_args.{name}={value!r}: expected an integer >= {low}", _dm, synth,
            **{name: value})


@pytest.mark.parametrize("name, value", [("hidden_dim", 0), ("num_layers", 0), ("context_rows", 0),
                                         ("num_heads", 0), ("hidden_dim", -4)])
def test_head_integer_settings(name, value):
    _raises(SettingError, f"model.init_args.{name}={value!r}: expected an integer >= 1", TurnHead, **{name: value})
    _raises(SettingError, "model.init_args.in_dim=0: expected an integer >= 1, or null for the features' D",
            TurnHead, in_dim=0)
    _raises(SettingError, "model.init_args.head_type='gru': expected one of ['linear', 'mlp', 'causal_conv', "
            "'causal_attention']", TurnHead, head_type="gru")


def test_cli_integer_setting_is_one_line(capsys):
    from cli import main

    with pytest.raises(SystemExit) as e:
        main(lambda: cli_main(["fit", "--config", BASE, "--config", DEMO, "--trainer.logger=false",
                               "--data.init_args.chunk_rows=0"]))
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[0] == ("error: SettingError: data.init_args.chunk_rows=0: expected an "
                                                       "integer >= 1")


# ----------------------------------------------------------------------------------------- 2-4. checkpoints (CLI)
def _args(sub: str, synth: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [sub, "--config", BASE, "--config", DEMO, f"--data.init_args.features_dir={synth / 'features'}",
            f"--data.init_args.utterances_root={synth / 'transcripts'}", "--data.init_args.train_sessions=[1]",
            "--data.init_args.val_sessions=[2]", "--data.init_args.test_sessions=[3]",
            f"--trainer.default_root_dir={tmp_path / 'runs'}", "--trainer.logger=false",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", *extra]


def test_checkpoint_inputs(synth, tmp_path, capsys):
    from cli import main

    # 2. test / validate without --ckpt_path refuse (one line from the entry point), before scoring anything
    with pytest.raises(SystemExit) as e:
        main(lambda: cli_main(_args("test", synth, tmp_path)))
    assert e.value.code == 2
    need = ("train.py {} needs --ckpt_path=<checkpoint> (the 'best checkpoint:' path that train.py fit prints); "
            "without it the untrained head would be scored")
    assert capsys.readouterr().err.strip().splitlines()[0] == "error: SettingError: " + need.format("test")
    _raises(SettingError, need.format("validate"), cli_main, _args("validate", synth, tmp_path))
    _raises(SettingError, "data.init_args.test_sessions is empty: test needs at least one test session",
            cli_main, _args("test", synth, tmp_path, "--data.init_args.test_sessions=[]"))
    # fit (1 epoch), then test with the checkpoint works; the fitted trainer may validate its own head
    cli = cli_main(_args("fit", synth, tmp_path, "--trainer.max_epochs=1"))
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    assert cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    assert "test/auroc_mean" in cli_main(_args("test", synth, tmp_path, f"--ckpt_path={ckpt}")).trainer.callback_metrics
    # 3. a truncated checkpoint is named
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(Path(ckpt).read_bytes()[:3000])
    msg = (f"--ckpt_path={cut}: not a readable checkpoint (truncated or not a .ckpt written by train.py fit; "
           "BadZipFile: File is not a zip file)")
    _raises(CheckpointError, msg, cli_main, _args("test", synth, tmp_path, f"--ckpt_path={cut}"))
    _raises(CheckpointError, msg, cli_main, _args("test", synth, tmp_path, "--ckpt_path", str(cut)))
    assert ckpt_path_arg(["test", "--ckpt_path", "a.ckpt"]) == ckpt_path_arg(["--ckpt_path=a.ckpt"]) == "a.ckpt"
    check_checkpoint_file(ckpt)   # a whole checkpoint passes
    # 4. a checkpoint of D = 8 on features of D = 6: both sizes, the checkpoint and the features folder named
    other = write_synthetic_dataset(tmp_path / "d6", num_sessions=3, duration_s=10.0, dim=6)
    _raises(SettingError, f"the head takes features of size D=8 (checkpoint {ckpt}), the features in "
            f"{other / 'features'} have D=6", cli_main,
            _args("test", other, tmp_path, f"--ckpt_path={ckpt}"))
    _raises(SettingError, f"the head takes features of size D=5 (model.init_args.in_dim), the features in "
            f"{synth / 'features'} have D=8", cli_main,
            _args("fit", synth, tmp_path, "--model.init_args.in_dim=5", "--trainer.max_epochs=1"))
    assert not list((tmp_path / "runs").glob("**/best-v*.ckpt"))   # the failed fit wrote no checkpoint


def test_a_wearer_silent_in_some_sessions_warns_and_in_all_is_refused(synth):
    dm = _dm(synth, wearer_id=2)
    with pytest.warns(UserWarning, match=r"wearer_id=2 never speaks in \['Session_4'\]: their wearer targets are all "
                                         "negative"):
        dm._check_wearer({"Session_1": [1, 2], "Session_4": [1, 3]})
    with pytest.raises(SettingError, match=r"^data.init_args.wearer_id=2 never occurs in the utterances \(participant "
                                           r"ids: Session_1 \[1\], Session_4 \[3\]\)$"):
        dm._check_wearer({"Session_1": [1], "Session_4": [3]})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dm._check_wearer({"Session_1": [2], "Session_4": [1, 2]})   # speaks everywhere: silent


def test_wandb_mode_from_the_environment_decides(monkeypatch, tmp_path):
    """``WANDB_MODE=disabled`` must not be overwritten by the logger's offline default (Lightning sets
    WANDB_MODE=dryrun for offline loggers)."""
    from callbacks.run_folder import AutoWandbLogger

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))        # no ~/.netrc key
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert AutoWandbLogger(save_dir=str(tmp_path))._offline is True
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert AutoWandbLogger(save_dir=str(tmp_path))._offline is False
    assert AutoWandbLogger(save_dir=str(tmp_path), offline=True)._offline is True


# ------------------------------------------------------------------------------------------------ log-mel left context
def test_features_from_before_the_logmel_left_context_are_refused(synth, tmp_path):
    """A file without ``audio_left_context`` (extracted before it existed: reflect padding at every payload) counts
    as ``False`` and does not mix with today's features unless the run says so."""
    import shutil

    from datamodules.features import feature_path, load_features, save_features

    feats = Path(shutil.copytree(synth / "features", tmp_path / "features"))
    path = feature_path(feats, "Session_2", "open-stream-replay")
    tensors, meta = load_features(path)
    assert meta["audio_left_context"] is True
    save_features(path, tensors, {k: v for k, v in meta.items() if k != "audio_left_context"})
    with pytest.raises(FeatureFileError, match=r"Session_2\.open-stream-replay\.safetensors: feature file does not "
                                               r"match this run \(audio_left_context: expected True, file has False\)"):
        _dm(synth, features_dir=str(feats)).load()
    assert _dm(synth, features_dir=str(feats), expected_audio_left_context=None).load()
