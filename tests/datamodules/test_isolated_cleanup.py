"""A worker killed (SIGTERM at a run's stop) while its file is decoded in a process of its own: the child dies with
it, and the hand-over folder is in the run's marks folder (removed by the main process), not left in /tmp."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

from datamodules.decode.isolated import decode_isolated
from tests.conftest import MEDIA


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_the_child_dies_with_its_worker_and_its_folder_is_in_the_runs_marks_folder(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    worker = multiprocessing.get_context("fork").Process(
        target=decode_isolated, args=(str(MEDIA / "cockatoo.mp4"), 128),
        kwargs={"runner": "tests.datamodules.sleeping_decode_runner", "tmp_dir": str(marks)})
    worker.start()
    deadline = time.monotonic() + 30
    while not list(marks.glob("tokenbudget-isolated-*/pid")) and time.monotonic() < deadline:
        time.sleep(0.05)
    [pid_file] = list(marks.glob("tokenbudget-isolated-*/pid"))
    child = int(pid_file.read_text())
    os.kill(worker.pid, signal.SIGTERM)
    worker.join(5)
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)   # no orphan decoding on
    # without a marks folder (no workers) the folder is made in the system's temporary folder, as before
    gone = tmp_path / "gone"
    assert decode_isolated(str(MEDIA / "cockatoo.mp4"), 128, tmp_dir=str(gone)).info["decoded_isolated"] is True


def test_the_dataset_makes_the_hand_over_folder_in_its_marks_folder(tmp_path, monkeypatch):
    from datamodules.benchmarks import Question
    from datamodules.video_items import VideoQADataset, VideoTask

    seen = []
    monkeypatch.setattr("datamodules.video_items.decode_isolated",
                        lambda path, *a, **k: seen.append(k.get("tmp_dir")) or decode_isolated(path, *a, **k))
    path = str(MEDIA / "realshort.mp4")
    ds = VideoQADataset([VideoTask("c", path, "videomme", [Question("q", "c", path, "Q?", ["a", "b"], "A")])], 128,
                        decoding_dir=str(tmp_path), isolated={path})
    assert ds[0]["error"] is None and seen == [str(tmp_path)]
    assert list(tmp_path.iterdir()) == []   # removed after the decode
