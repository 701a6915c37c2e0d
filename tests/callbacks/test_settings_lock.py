"""Issue 43 item 6: the output folder's settings lock compares the loader arguments the loader will use, not their
spelling: ``loader_kwargs: {}`` and ``{video_dir: videos}`` name the same folder, so a run with one resumes a folder
written with the other; another folder is still refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_predict

# load_videomme(root, parquet=None, video_dir="videos", subtitles=False, subtitle_dir="subtitles")'s defaults
VIDEOMME_DEFAULTS = {"parquet": None, "video_dir": "videos", "subtitles": False, "subtitle_dir": "subtitles"}


def test_loader_kwargs_are_recorded_as_the_values_the_loader_uses(tmp_path):
    from datamodules.benchmarks import canonical_loader_kwargs
    from datamodules.videoqa import VideoQADataModule

    for spelling in ({}, {"video_dir": "videos"}, {"video_dir": "./videos/"}, {"subtitles": False}):
        dm = VideoQADataModule(root=str(tmp_path), loader_kwargs=spelling, num_workers=0)
        assert dm.record_settings()["loader_kwargs"] == VIDEOMME_DEFAULTS, spelling
        assert dm.loader_kwargs == spelling            # the loader itself still gets what was given
    assert canonical_loader_kwargs("videomme", {"video_dir": "clips"}) == {**VIDEOMME_DEFAULTS, "video_dir": "clips"}
    assert canonical_loader_kwargs("videomme", {"parquet": "a/x.parquet"})["parquet"] == str(
        (Path.cwd() / "a" / "x.parquet").resolve())                # relative to the working directory
    # MLVU's json_dir / video_dir defaults, a tuple of tasks as JSON keeps it
    assert canonical_loader_kwargs("mlvu", {"tasks": ("count",)}) == {"json_dir": "json", "video_dir": "video",
                                                                      "tasks": ["count"]}
    assert canonical_loader_kwargs("videomme", {"typo": 1}) == {"typo": 1}   # left to the loader's own error


def _locked_folder(tmp_path, loader_kwargs) -> tuple:
    """An output folder as a run of today's writer left it: run.json with the literal ``loader_kwargs`` and one
    answered record (so it is locked)."""
    out = tmp_path / "out"
    (out / "b128" / "videomme").mkdir(parents=True)
    settings = {"benchmark": "videomme", "root": str(tmp_path / "bench"), "loader_kwargs": loader_kwargs}
    (out / "run.json").write_text(json.dumps(settings))
    (out / "b128" / "videomme" / "rank0.jsonl").write_text(json.dumps({"qid": "q", "job": "b128", "pred": "A"}) + "\n")
    return out, settings


@pytest.mark.parametrize("there, here", [({}, {"video_dir": "videos"}), ({"video_dir": "videos"}, {}),
                                         ({"video_dir": "videos/"}, {"video_dir": "videos"})])
def test_a_folder_resumes_with_another_spelling_of_its_loader_kwargs(tmp_path, there, here):
    from callbacks.jsonl_writer import OutputSettingsError, check_run_settings
    from datamodules.videoqa import VideoQADataModule

    out, settings = _locked_folder(tmp_path, there)
    now = {**settings, "loader_kwargs": VideoQADataModule(root=settings["root"], loader_kwargs=here,
                                                          num_workers=0).record_settings()["loader_kwargs"]}
    check_run_settings(out, now, write=True, canonical=VideoQADataModule.canonical_settings)
    assert json.loads((out / "run.json").read_text()) == settings   # the same settings: the file is left as it was
    other = {**now, "loader_kwargs": {**VIDEOMME_DEFAULTS, "video_dir": "clips"}}   # another folder: refused
    with pytest.raises(OutputSettingsError, match=r"loader_kwargs: .*'video_dir': 'videos'.* there, "
                                                  r".*'video_dir': 'clips'.* now"):
        check_run_settings(out, other, write=True, canonical=VideoQADataModule.canonical_settings)


@pytest.mark.slow   # ~20 s on 2 cores: two predict runs (the twins above check the same at the writer's level)
def test_predict_resumes_a_folder_written_with_the_default_video_dir_spelled_out(tiny_vl3_dir, demo_bench, tmp_path):
    """The whole CLI: a run with ``loader_kwargs: {}`` then the same command with ``{video_dir: videos}``."""
    from callbacks.jsonl_writer import read_records

    out = tmp_path / "out"
    args = dict(budgets=(128,), model_args={"max_new_tokens": 2}, extra=["--data.init_args.limit_videos=1"])
    first = run_predict(tiny_vl3_dir, demo_bench, out, **args)
    assert len(first) == 4                                 # cockatoo, first in the annotation: 4 questions
    again = run_predict(tiny_vl3_dir, demo_bench, out, budgets=(128,), model_args={"max_new_tokens": 2},
                        extra=["--data.init_args.loader_kwargs={video_dir: videos}"])
    # accepted: the run resumed, answering only the other video (realshort, 3 questions); nothing written twice
    assert again == read_records(out) and all(r in again for r in first)
    assert len(again) == 7 and len({(r["job"], r["qid"]) for r in again}) == 7


def test_a_plain_predict_and_a_layout_ablation_do_not_share_a_folder(tmp_path):
    """The ablation's run.json keeps ``decode_budget`` (the frames of every job), a plain predict's does not (it
    decodes for its largest budget). Run into each other's folder, the missing key was not compared, so the two
    kinds of records (decoded for different budgets) mixed in one folder and its run.json no longer said which
    frames its records have. Each is refused, naming the folder; an ablation folder written before
    ``decode_budget`` was kept (``base_b<B>/`` records, no key) still resumes."""
    from callbacks.jsonl_writer import OutputSettingsError, check_run_settings

    plain, settings = _locked_folder(tmp_path, {"video_dir": "media"})     # b128/ records, no decode_budget
    ablation = {**settings, "decode_budget": 16384, "no_reuse": False}
    with pytest.raises(OutputSettingsError, match=f"{plain} holds a plain predict's records .*decode_budget"):
        check_run_settings(plain, ablation, write=True)
    assert json.loads((plain / "run.json").read_text()) == settings
    abl = tmp_path / "abl"
    check_run_settings(abl, ablation, write=True)
    (abl / "base_b128" / "videomme").mkdir(parents=True)
    (abl / "base_b128" / "videomme" / "rank0.jsonl").write_text(json.dumps({"qid": "q", "pred": "A"}) + "\n")
    with pytest.raises(OutputSettingsError, match=f"{abl} holds a layout ablation's records \\(decode_budget 16384"):
        check_run_settings(abl, settings, write=True)
    (abl / "run.json").write_text(json.dumps(settings))                     # written before decode_budget was kept
    check_run_settings(abl, ablation, write=True)


def test_a_budget_above_the_folders_largest_is_refused_and_one_below_resumes(tiny_vl3_dir, tmp_path):
    """Every video is decoded for the run's largest budget and the smaller jobs' frames thinned from it: a long
    video's b128 record came out with other frames when 8192 was added to [128, 1024] (measured: a 1-hour VFR clip,
    ``sample_fps`` 0.0358 against 0.2847). Before, a folder took the larger budget and its b128 job mixed the two."""
    from callbacks.jsonl_writer import OutputSettingsError, check_run_settings
    from lightning_modules.budgeted_qa import BudgetedQA
    from lightning_modules.layout_ablation import LayoutAblationQA

    def settings(budgets):
        return BudgetedQA(model_path=str(tiny_vl3_dir), budgets=budgets).record_settings()

    assert settings([1024, 128])["largest_budget"] == 1024
    out = tmp_path / "folder"
    check_run_settings(out, settings([128, 1024]), write=True)
    (out / "b128" / "videomme").mkdir(parents=True)
    (out / "b128" / "videomme" / "rank0.jsonl").write_text('{"qid": "1", "job": "b128"}\n')
    with pytest.raises(OutputSettingsError, match="largest_budget: 1024 there, 8192 now"):
        check_run_settings(out, settings([128, 1024, 8192]), write=True)
    with pytest.raises(OutputSettingsError, match="largest_budget: 1024 there, 128 now"):
        check_run_settings(out, settings([128]), write=True)
    check_run_settings(out, settings([128, 256, 1024]), write=True)      # a budget below the largest: resumes
    older = json.loads((out / "run.json").read_text())
    del older["largest_budget"]                                           # a folder written before it was kept
    (out / "run.json").write_text(json.dumps(older))
    check_run_settings(out, settings([128, 1024, 8192]), write=False)
    # the layout ablation decodes for its own decode_budget, which its run.json keeps instead
    ablation = LayoutAblationQA(model_path=str(tiny_vl3_dir), jobs="base:256").record_settings()
    assert "largest_budget" not in ablation and ablation["decode_budget"] == 16384
