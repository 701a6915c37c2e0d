"""Without decode workers the main process decodes: a decoder crash there ends the process with no Python line, so
the video it was decoding is named in ``<out_dir>/decoding_rank<r>.txt`` while it decodes; the next run of the
folder reads that file, says which video it was, and decodes it in a process of its own (as a worker's crash)."""
from __future__ import annotations

import multiprocessing
import os

from datamodules.benchmarks import Question
from datamodules.video_items import VideoQADataset, VideoTask, decode_video
from tests.conftest import MEDIA


def _task(path: str) -> VideoTask:
    return VideoTask("v", path, "videomme", [Question("q", "v", path, "Q?", ["a", "b"], "A")])


def _crash_while_decoding(mark: str, path: str) -> None:   # in a forked child
    import datamodules.video_items as vi

    vi.decode_video = lambda *a, **k: os._exit(3)           # the process ends mid-decode (no finally runs)
    VideoQADataset([_task(path)], 128, main_mark=mark)[0]


def test_the_mark_names_the_video_while_it_decodes_and_stays_if_the_process_dies(tmp_path, monkeypatch):
    path, mark = str(MEDIA / "realshort.mp4"), tmp_path / "decoding_rank0.txt"
    seen = []

    def watching(*args, **kwargs):
        seen.append(mark.read_text(encoding="utf-8"))
        return decode_video(*args, **kwargs)

    monkeypatch.setattr("datamodules.video_items.decode_video", watching)
    item = VideoQADataset([_task(path)], 128, main_mark=str(mark))[0]
    assert item["error"] is None and seen == [path] and not mark.exists()    # removed once the decode returned
    child = multiprocessing.get_context("fork").Process(target=_crash_while_decoding, args=(str(mark), path))
    child.start()
    child.join(60)
    assert child.exitcode == 3 and mark.read_text(encoding="utf-8") == path  # left behind by the dead process


def test_the_next_run_names_the_video_and_decodes_it_apart(tiny_vl3_dir, demo_bench, tmp_path, capsys):
    from callbacks.jsonl_writer import DECODE_CRASHES
    from tests.conftest import run_predict

    out = tmp_path / "out"
    out.mkdir()
    crashed = str(demo_bench / "videos" / "realshort.mp4")
    (out / "decoding_rank0.txt").write_text(crashed, encoding="utf-8")     # as a crashed run leaves it
    records = run_predict(tiny_vl3_dir, demo_bench, out, budgets=(128,), model_args={"max_new_tokens": 2})
    said = capsys.readouterr().out
    assert f"the last run of this folder ended while decoding {crashed} in its main process" in said
    assert (out / DECODE_CRASHES).read_text(encoding="utf-8").splitlines() == [crashed]
    assert not (out / "decoding_rank0.txt").exists()
    qids = [r["qid"] for r in records]
    assert len(qids) == len(set(qids)) == 7 and not [r for r in records if r.get("error")]
    assert {r["video"] for r in records if r["video_info"].get("decoded_isolated")} == {"realshort"}
