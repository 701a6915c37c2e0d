"""What a user meets on a bad command line or a wrong folder (issue 34 items 2 and 8): one line naming the key or
the folder, a close key suggested, nothing written before a run that can do nothing stops."""
import json
import shutil
import sys

import pytest

from tests.conftest import DEMO_PARQUET, MEDIA


@pytest.fixture(autouse=True)
def _argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["evaluate.py"])     # LightningCLI must see only the arguments a test passes


def _cli_error(capsys, *args):
    import evaluate

    with pytest.raises(SystemExit) as info:
        evaluate.cli_main(["predict", *args])
    assert info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


def test_a_mistyped_key_suggests_the_right_one(capsys, tmp_path):
    err = _cli_error(capsys, "--model.init_args.budget=[128]")
    assert err[-1] == "error: model.init_args.budget: BudgetedQA has no setting 'budget'; did you mean 'budgets'?"
    assert len(err) == 3                                                   # usage, tip, the error
    typo = tmp_path / "typo.yaml"                                          # the same typo in a YAML file
    typo.write_text("data:\n  init_args:\n    num_worker: 1\n")
    err = _cli_error(capsys, f"--config={typo}")
    assert err[-1] == ("error: data.init_args.num_worker: VideoQADataModule has no setting 'num_worker'; did you "
                       "mean 'num_workers'?")
    err = _cli_error(capsys, "--model.init_args.zzz=1")                    # nothing close: the settings listed
    assert err[-1].startswith("error: model.init_args.zzz: BudgetedQA has no setting 'zzz'; its settings: "
                              "model_path, budgets,")


def test_a_bad_value_in_a_yaml_names_the_key_without_dumping_init_args(capsys, tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text("model:\n  init_args:\n    max_new_tokens: lots\n    budgets: [64]\n")
    err = _cli_error(capsys, f"--config={typo}")
    assert err[-1] == "error: model.init_args.max_new_tokens: Expected a int. Got value: lots (BudgetedQA)"
    assert not any("Given value" in ln or "init_args" in ln and "budgets" in ln for ln in err)


def test_predict_refuses_a_trainer_precision_it_would_ignore(capsys):
    import evaluate
    from algorithms.errors import SettingError

    with pytest.raises(SettingError, match=r"^--trainer.precision=bf16-true is not applied by predict: the model "
                                           r"runs in model.init_args.dtype"):
        evaluate.cli_main(["predict", "--trainer.precision=bf16-true"], run=True)


def test_abbreviated_options_are_refused(capsys):
    """argparse's prefix matching took ``--trainer.limit_predict_batche=0`` for ``--trainer.limit_predict_batches``:
    refused now (``allow_abbrev=False`` on every parser), naming the option it resembles."""
    err = _cli_error(capsys, "--trainer.limit_predict_batche=0")
    assert err[-1] == ("error: unrecognized arguments: --trainer.limit_predict_batche=0; did you mean "
                       "'--trainer.limit_predict_batches'?")
    assert _cli_error(capsys, "--trainer.max_epoch=1")[-1] == (
        "error: unrecognized arguments: --trainer.max_epoch=1; did you mean '--trainer.max_epochs'?")
    assert _cli_error(capsys, "--zzz=1")[-1] == "error: unrecognized arguments: --zzz=1"   # nothing close: no hint


def test_the_simplifier_leaves_other_messages_alone_but_drops_value_dumps():
    from cli import simplify_cli_error

    assert simplify_cli_error("unrecognized arguments: --x=1") == "unrecognized arguments: --x=1"
    msg = "Parser key \"a\":\n  Expected x\n  Given value type: dict\n  Given value: {" + "'k': 1, " * 200 + "}"
    assert simplify_cli_error(msg) == "Parser key \"a\":\n  Expected x"


# ------------------------------------------------------------------------------------------ wrong folders
def _bench(tmp_path, videos=("cockatoo.mp4", "realshort.mp4")):
    root = tmp_path / "bench"
    (root / "videomme").mkdir(parents=True)
    (root / "videos").mkdir()
    shutil.copy(DEMO_PARQUET, root / "videomme" / DEMO_PARQUET.name)
    for v in videos:
        shutil.copy(MEDIA / v, root / "videos" / v)
    return root


def test_a_missing_root_says_so(tmp_path):
    from algorithms.errors import SettingError
    from datamodules.videoqa import VideoQADataModule

    with pytest.raises(SettingError, match=rf"^data.init_args.root={tmp_path / 'nope'}: the benchmark root does "
                                           "not exist$"):
        VideoQADataModule(root=str(tmp_path / "nope"), num_workers=0).setup("predict")


def test_most_videos_missing_stops_with_one_line_naming_the_folder(tmp_path, caplog):
    from datamodules.benchmarks.base import MediaMissingError
    from datamodules.videoqa import VideoQADataModule

    root = _bench(tmp_path)
    dm = VideoQADataModule(root=str(root), loader_kwargs={"video_dir": "media"}, num_workers=0)   # the demo's
    with pytest.raises(MediaMissingError) as info:
        dm.setup("predict")
    msg = str(info.value)
    assert msg.startswith(f"videomme at {root} with loader_kwargs {{'video_dir': 'media'}}: 2 of 2 videos are "
                          f"missing from {root / 'media'} (e.g. ") and "\n" not in msg
    one_left = _bench(tmp_path / "half", videos=("cockatoo.mp4",))       # 1 of 2 missing: not most; error records
    dm = VideoQADataModule(root=str(one_left), num_workers=0)
    dm.setup("predict")
    assert len(dm.questions) == 7 and "1 of 2 videos are missing" in caplog.text


def test_most_videos_empty_stops_before_writing_naming_them(tiny_vl3_dir, tmp_path, caplog):
    """Every video a 0-byte file (an unfinished copy): the run could write nothing but error records, so it stops
    before writing, saying how many are empty; one empty file of two is the run's business (error records)."""
    from datamodules.benchmarks.base import MediaMissingError
    from datamodules.videoqa import VideoQADataModule
    from tests.conftest import run_predict

    root = _bench(tmp_path, videos=())
    for v in ("cockatoo.mp4", "realshort.mp4"):
        (root / "videos" / v).write_bytes(b"")
    out = tmp_path / "out"
    with pytest.raises(MediaMissingError) as info:
        run_predict(tiny_vl3_dir, root, out, budgets=(128,))
    msg = str(info.value)
    assert f"2 of 2 videos in {root / 'videos'} cannot be read: 2 empty files (0 bytes, e.g. " in msg
    assert "missing (e.g." not in msg and "\n" not in msg
    assert not out.exists()
    (root / "videos" / "realshort.mp4").unlink()                           # 1 empty + 1 missing of 2: stops too
    with pytest.raises(MediaMissingError, match=r"cannot be read: 1 empty file \(0 bytes, e.g. cockatoo.mp4; .*\) "
                                                r"and 1 missing \(e.g. realshort.mp4\)"):
        VideoQADataModule(root=str(root), num_workers=0).setup("predict")
    shutil.copy(MEDIA / "realshort.mp4", root / "videos" / "realshort.mp4")   # 1 empty of 2: not most; runs
    dm = VideoQADataModule(root=str(root), num_workers=0)
    dm.setup("predict")
    assert len(dm.questions) == 7


@pytest.mark.parametrize("key", ["video_dir", "subtitle_dir"])
def test_a_video_folder_outside_the_root_names_the_setting_not_a_row(tmp_path, key):
    """An annotation copied elsewhere with ``video_dir`` pointed back at the videos by an absolute path used to be
    blamed on the annotation's row 0 ("media path '/abs/cockatoo.mp4' must be a non-empty path relative to ..."):
    the setting is named instead."""
    from algorithms.errors import SettingError
    from datamodules.videoqa import VideoQADataModule

    root = _bench(tmp_path)
    for value in (str(MEDIA), "../media"):
        kw = {key: value, **({"subtitles": True} if key == "subtitle_dir" else {})}
        dm = VideoQADataModule(root=str(root), loader_kwargs=kw, num_workers=0)
        with pytest.raises(SettingError) as info:
            dm.setup("predict")
        msg = str(info.value)
        assert msg.startswith(f"data.init_args.loader_kwargs.{key}={value}: must be a folder inside the benchmark "
                              f"root {root}")
        assert "row" not in msg and "\n" not in msg
    dm = VideoQADataModule(root=str(root), loader_kwargs={"video_dir": "./videos/"}, num_workers=0)   # relative: fine
    dm.setup("predict")
    assert len(dm.questions) == 7


def test_a_folder_of_only_missing_video_errors_is_not_locked(tmp_path):
    from callbacks.jsonl_writer import OutputSettingsError, check_run_settings

    out = tmp_path / "out"
    (out / "b128" / "videomme").mkdir(parents=True)
    (out / "run.json").write_text(json.dumps({"root": "/wrong"}))
    errors = [{"qid": f"q{i}", "job": "b128", "error": f"/wrong/media/v{i}.mp4: video file not found"}
              for i in range(3)]
    (out / "b128" / "videomme" / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in errors))
    check_run_settings(out, {"root": "/right"}, write=True)                # replaced: nothing to protect
    assert json.loads((out / "run.json").read_text()) == {"root": "/right"}
    with open(out / "b128" / "videomme" / "rank0.jsonl", "a") as fh:       # one real answer: locked again
        fh.write(json.dumps({"qid": "q9", "job": "b128", "answer": "A", "pred": "A"}) + "\n")
    with pytest.raises(OutputSettingsError, match="holds records made with other settings"):
        check_run_settings(out, {"root": "/elsewhere"}, write=True)


def test_predict_with_a_wrong_video_folder_writes_nothing(tiny_vl3_dir, tmp_path):
    from datamodules.benchmarks.base import MediaMissingError
    from tests.conftest import run_predict

    root = _bench(tmp_path, videos=())
    out = tmp_path / "out"
    with pytest.raises(MediaMissingError, match=f"missing from {root / 'videos'}"):
        run_predict(tiny_vl3_dir, root, out, budgets=(128,))
    assert not out.exists()


# ------------------------------------------------------------------------------------------ bad dtype
DTYPE_ERROR = ("model.init_args.dtype: 'bf15' is not a torch dtype the models run in; use one of bfloat16, "
               "float16, float32")


@pytest.mark.parametrize("config", [None, "configs/predict/ablate.yaml", "configs/predict/worldsense_pruning.yaml",
                                    "configs/extract/completed_block_hold.yaml"])
def test_a_bad_dtype_is_one_line_and_writes_nothing(capsys, tmp_path, monkeypatch, config):
    """``--model.init_args.dtype=bf15`` on every predict job: one line naming the field and the allowed values, exit
    status 2, and no output folder (before the fix: a raw traceback after run.json was written)."""
    import evaluate
    from cli import main

    monkeypatch.delenv("TOKENBUDGET_TRACEBACK", raising=False)
    out = tmp_path / "out"
    args = ["predict", *([f"--config={config}"] if config else []), "--model.init_args.dtype=bf15",
            f"--trainer.callbacks.init_args.out_dir={out}"]
    with pytest.raises(SystemExit) as info:
        main(lambda: evaluate.cli_main(args))
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()    # (Lightning's log lines may come first)
    assert err[-2:] == [f"error: SettingError: {DTYPE_ERROR}", "(set TOKENBUDGET_TRACEBACK=1 for the full traceback)"]
    assert not out.exists()


def test_every_module_with_a_dtype_checks_it_at_construction():
    from algorithms.errors import SettingError
    from lightning_modules.budgeted_qa import BudgetedQA
    from lightning_modules.layout_ablation import LayoutAblationQA
    from lightning_modules.omni_extractor import OmniFeatureExtractor
    from lightning_modules.omni_qa import OmniPruningQA

    for make in (lambda d: BudgetedQA(dtype=d), lambda d: LayoutAblationQA(dtype=d),
                 lambda d: OmniPruningQA("/nonexistent/omni", dtype=d),
                 lambda d: OmniFeatureExtractor("/nonexistent/omni", dtype=d)):
        with pytest.raises(SettingError) as info:
            make("bf15")
        assert str(info.value) == DTYPE_ERROR
        with pytest.raises(SettingError, match=r"^model.init_args.dtype: 'half' is not a torch dtype"):
            make("half")
    assert BudgetedQA(dtype="bfloat16").hparams.dtype == "bfloat16"


def test_a_command_line_builds_only_its_subcommands_parser(monkeypatch, capsys, tmp_path):
    """``evaluate.py predict ...`` builds predict's parser only (each subcommand's resolves the Trainer's, model's
    and data module's signatures); the parsed settings are those of a CLI with every subcommand. Without a
    subcommand first, every one is offered."""
    import evaluate
    from lightning.pytorch.cli import LightningCLI

    monkeypatch.setattr(LightningCLI, "_run_subcommand", lambda self, subcommand: None)
    argv = ["predict", "--model.init_args.budgets=[128]", f"--trainer.callbacks.init_args.out_dir={tmp_path / 'o'}"]
    only = evaluate.cli_main(argv)
    assert set(only._subcommand_parsers) == {"predict"}
    monkeypatch.setattr("cli.ProjectCLI.subcommands", lambda self: LightningCLI.subcommands())
    every = evaluate.cli_main(argv)
    assert set(every._subcommand_parsers) == {"fit", "validate", "test", "predict"}
    assert only.parser.dump(only.config) == every.parser.dump(every.config)
    assert dict(only.model.hparams) == dict(every.model.hparams) and dict(only.model.hparams)["budgets"] == [128]
    with pytest.raises(SystemExit):
        evaluate.cli_main(["--help"])
    assert "{fit,validate,test,predict}" in capsys.readouterr().out


def test_a_warning_during_the_progress_bar_gets_a_line_of_its_own(monkeypatch):
    """A bad video's one console line (``log.warning`` of a project module, which has no handler of its own) is
    printed while the predict progress bar is drawn on the same terminal: it must start a line of its own, not be
    glued after the bar's text."""
    import io
    import logging
    import sys

    from tqdm import tqdm

    from cli import quiet_console

    term = io.StringIO()                          # stdout and stderr on one terminal
    monkeypatch.setattr(sys, "stdout", term)
    monkeypatch.setattr(sys, "stderr", term)
    monkeypatch.setattr(logging, "lastResort", logging.lastResort)   # restored after the test
    quiet_console()
    bar = tqdm(total=5, desc="Predicting DataLoader 0", file=sys.stdout, ascii=True)
    bar.update(2)
    quiet = logging.getLogger("tests.no_handler_here")   # as on the console: no handler up its chain (pytest's
    monkeypatch.setattr(quiet, "propagate", False)       # capture handler sits on the root logger)
    quiet.warning("video c2: /x/c2.mp4: cannot read the container")
    bar.close()
    (line,) = [ln for ln in term.getvalue().split("\n") if "c2.mp4" in ln]
    assert line.split("\r")[-1] == "video c2: /x/c2.mp4: cannot read the container"


@pytest.mark.parametrize("budgets, said", [([], "model.init_args.budgets must not be empty"),
                                           ([-128], "model.init_args.budgets: a budget of -128 vision tokens is "
                                                    "smaller than one compressed group (64 rows)"),
                                           ([128, 128], "model.init_args.budgets [128, 128] repeat a value")])
def test_a_bad_budget_list_names_the_setting(budgets, said):
    from algorithms.errors import SettingError
    from lightning_modules.budgeted_qa import BudgetedQA

    with pytest.raises(SettingError) as info:
        BudgetedQA(model_path="/nowhere", budgets=budgets, early_start=False)
    assert str(info.value) == said


def test_a_run_where_every_video_is_unreadable_finishes_then_exits_1(tiny_vl3_dir, tmp_path, capsys, monkeypatch):
    """The trial's case: both videos replaced by text files (not 0 bytes, so the run starts): every question gets
    its error record, the table and report are written, the table says NOTHING WAS ANSWERED, and the process exits
    with status 1, its last line saying so (it exited 0, as a run that answered)."""
    import sys

    import yaml

    import evaluate
    from cli import main

    root = _bench(tmp_path)
    for v in ("cockatoo.mp4", "realshort.mp4"):
        (root / "videos" / v).write_text("hi\n")
    out = tmp_path / "out"
    cfg = {"trainer": {"enable_progress_bar": False, "callbacks": [
        {"class_path": "callbacks.jsonl_writer.JsonlPredictionWriter", "init_args": {"out_dir": str(out)}},
        {"class_path": "callbacks.scoring.ScoreOnPredictEnd", "init_args": {"plots": False}}]},
        "model": {"class_path": "lightning_modules.budgeted_qa.BudgetedQA",
                  "init_args": {"model_path": str(tiny_vl3_dir), "budgets": [128], "max_new_tokens": 2}},
        "data": {"class_path": "datamodules.videoqa.VideoQADataModule",
                 "init_args": {"root": str(root), "loader_kwargs": {}, "num_workers": 0}}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.setattr(sys, "argv", ["evaluate.py"])
    with pytest.raises(SystemExit) as info:
        main(lambda: evaluate.cli_main(["predict", f"--config={tmp_path / 'run.yaml'}"]))
    captured = capsys.readouterr()
    assert info.value.code == 1
    assert captured.err.strip().splitlines()[-1] == (
        f"error: nothing was answered: all 7 records in {out} are error records (each names its file and cause: see "
        "the lines above or report.html)")
    assert "NOTHING WAS ANSWERED: all 7 records are error records" in captured.out
    assert (out / "report.html").is_file() and (out / "scores.json").is_file()
