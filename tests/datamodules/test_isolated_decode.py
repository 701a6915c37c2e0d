"""A file that killed a decode worker is decoded in a process of its own in the next run of the output folder
(``datamodules.decode.isolated``): the same frames as in the worker, and a second crash is that video's error."""
from __future__ import annotations

import torch

from datamodules.benchmarks import Question
from datamodules.decode import DecodeError, decode_video
from datamodules.decode.isolated import decode_isolated
from datamodules.video_items import VideoQADataset, VideoTask
from tests.conftest import MEDIA


def test_isolated_decode_gives_the_workers_frames():
    path = str(MEDIA / "cockatoo.mp4")
    here = decode_video(path, 256, num_threads=1)
    apart = decode_isolated(path, 256, num_threads=1)
    assert torch.equal(torch.as_tensor(apart.frames), torch.as_tensor(here.frames))
    assert apart.times_s == here.times_s
    assert apart.info == {**here.info, "decoded_isolated": True}


def test_a_crash_in_the_child_is_the_videos_decode_error_and_a_decode_error_keeps_its_words(tmp_path):
    path = str(MEDIA / "cockatoo.mp4")
    try:
        decode_isolated(path, 256, runner="tests.datamodules.crashing_decode_runner")
    except DecodeError as e:
        assert str(e) == (f"{path}: the decoder crashed on this file again (SIGSEGV), in a process of its own: it "
                          "killed a decode worker in an earlier run of this output folder")
    else:
        raise AssertionError("no DecodeError")
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    words = []
    for decode in (decode_video, decode_isolated):   # the child's DecodeError comes back with the worker's words
        try:
            decode(str(empty), 256)
        except DecodeError as e:
            words.append(str(e))
    assert len(words) == 2 and words[0] == words[1]


def test_the_dataset_decodes_listed_videos_apart(monkeypatch):
    """``VideoQADataset(isolated=...)``: a listed video goes through the child (its records say
    ``decoded_isolated``); the others are decoded in the worker as before."""
    calls = []
    monkeypatch.setattr("datamodules.video_items.decode_isolated",
                        lambda path, *a, **k: calls.append(path) or decode_isolated(path, *a, **k))
    good, crashed = str(MEDIA / "cockatoo.mp4"), str(MEDIA / "realshort.mp4")
    tasks = [VideoTask(v, p, "videomme", [Question(f"q{v}", v, p, "Q?", ["a", "b"], "A")])
             for v, p in (("g", good), ("c", crashed))]
    ds = VideoQADataset(tasks, 128, isolated={crashed})
    items = [ds[0], ds[1]]
    assert calls == [crashed]
    assert [i["error"] for i in items] == [None, None]
    assert "decoded_isolated" not in items[0]["video_info"] and items[1]["video_info"]["decoded_isolated"] is True


def test_a_worker_killed_by_a_file_stops_the_run_once_then_that_file_is_decoded_apart(tiny_vl3_dir, demo_bench,
                                                                                        tmp_path, monkeypatch):
    """A decode worker killed while it decodes ``realshort.mp4`` (SIGKILL, as the out-of-memory killer or a decoder
    crash ends it): the run stops and the output folder's ``decode_crashes.txt`` names the file; the same command
    then decodes it in a process of its own (where it decodes: this stand-in crash lives in the workers only) and
    the run completes, every question answered once."""
    import os
    import signal

    import pytest

    from callbacks.jsonl_writer import DECODE_CRASHES
    from tests.conftest import run_predict

    real = decode_video

    def crashing(path, *args, **kwargs):   # inherited by the forked workers
        if str(path).endswith("realshort.mp4"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path, *args, **kwargs)

    monkeypatch.setattr("datamodules.video_items.decode_video", crashing)
    out = tmp_path / "out"
    workers = ["--data.init_args.num_workers=1"]
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        run_predict(tiny_vl3_dir, demo_bench, out, budgets=(128,), extra=workers, model_args={"max_new_tokens": 2})
    crashed = str(demo_bench / "videos" / "realshort.mp4")
    assert (out / DECODE_CRASHES).read_text(encoding="utf-8").splitlines() == [crashed]
    records = run_predict(tiny_vl3_dir, demo_bench, out, budgets=(128,), extra=workers,
                          model_args={"max_new_tokens": 2})
    qids = [r["qid"] for r in records]
    assert len(qids) == len(set(qids)) == 7 and not [r for r in records if r.get("error")]
    isolated = {r["video"] for r in records if r["video_info"].get("decoded_isolated")}
    assert isolated == {"realshort"}
