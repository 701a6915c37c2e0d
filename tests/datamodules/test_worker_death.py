"""A decode worker that dies mid-run (a decoder crash on a file, the out-of-memory killer): torch raises it in the
main process in whatever that is doing, e.g. answering another video. Before, that video got error records saying
``RuntimeError: DataLoader worker (pid N) is killed by signal: Killed.`` (a good video blamed), and the run then
stopped with a traceback naming no video, so a rerun died on the same file without the user knowing which."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from datamodules.benchmarks import Question
from datamodules.video_items import (DecodeWorkerDied, VideoQADataset, VideoTask, dead_worker_pids,
                                     worker_death_message)


def test_the_video_in_hand_gets_no_error_record_and_the_dead_workers_video_is_named(tmp_path, monkeypatch):
    from lightning_modules.budgeted_qa import run_or_error_records

    (tmp_path / "4242").write_text("/data/crasher é.mp4", encoding="utf-8")   # the worker's mark, left by its death
    monkeypatch.setattr("datamodules.video_items.DECODING_DIRS", [str(tmp_path)])

    def run():   # torch's SIGCHLD handler raises this in the main process, here while it answers good.mp4
        raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Segmentation fault. ")

    written = []
    with pytest.raises(DecodeWorkerDied) as e:
        run_or_error_records({"video_id": "good", "video_path": "/data/good.mp4"}, run, written.append)
    assert written == []
    assert str(e.value).startswith("a decode worker died while decoding /data/crasher é.mp4 (RuntimeError: "
                                   "DataLoader worker (pid 4242) is killed by signal: Segmentation fault.); not a "
                                   "failure of /data/good.mp4")
    # any other RuntimeError is still that video's error record
    assert run_or_error_records({"video_path": "/data/v.mp4"}, lambda: (_ for _ in ()).throw(RuntimeError("bad")),
                                lambda m: [m]) == ["/data/v.mp4: RuntimeError: bad"]
    assert dead_worker_pids(RuntimeError("DataLoader worker (pid(s) 7, 8) exited unexpectedly")) == [7, 8]


def test_a_worker_killed_mid_decode_is_named_by_its_video(tmp_path, monkeypatch):
    """A real worker (forked, as on the CPU) killed with SIGKILL while it decodes ``crash.mp4``."""
    real = __import__("datamodules.video_items", fromlist=["decode_video"]).decode_video

    def decode_video(path, *args, **kwargs):
        if str(path).endswith("crash.mp4"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path, *args, **kwargs)

    monkeypatch.setattr("datamodules.video_items.decode_video", decode_video)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setattr("datamodules.video_items.DECODING_DIRS", [str(marks)])
    video = str(tmp_path / "crash.mp4")
    ds = VideoQADataset([VideoTask("c", video, "lvb", [Question("q", "c", video, "Q?", ["a", "b"], "A")])], 128,
                        decoding_dir=str(marks))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1,
                                         multiprocessing_context="fork")
    with pytest.raises(RuntimeError) as e:
        list(loader)
    msg = worker_death_message(e.value)
    assert msg is not None and msg.startswith(f"a decode worker died while decoding {video} (RuntimeError: "
                                              "DataLoader worker (pid")
    # in the main process (no worker) nothing is marked, and a decode that returns removes its mark
    assert ds._mark(video) is None


def test_the_cli_says_it_in_one_line(capsys):
    from cli import main

    def cli_main():
        raise RuntimeError("DataLoader worker (pid(s) 12345) exited unexpectedly")

    with pytest.raises(SystemExit) as e:
        main(cli_main)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == ("error: DecodeWorkerDied: a decode worker died, not while decoding a video this run names "
                      "(RuntimeError: DataLoader worker (pid(s) 12345) exited unexpectedly). The run stops (the "
                      "system's out-of-memory killer?): the records written before are safe, and a rerun resumes")


def test_the_other_ddp_process_says_in_one_line_that_a_peer_stopped(capsys):
    """With 2 DDP processes, the one whose decode worker died prints its line; the other's collective then fails
    (gloo: "Connection closed by peer"): one line too, not a second traceback."""
    from cli import main

    def cli_main():
        raise RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
                           "[127.0.0.1]:13231. This is typically caused by a remote worker crashing.")

    with pytest.raises(SystemExit) as e:
        main(cli_main)
    assert e.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err[0].startswith("error: OtherProcessStopped: another process of this run stopped first (its error is "
                             "printed above; here RuntimeError: [/pytorch/third_party/gloo")
    assert len(err) == 2 and "TOKENBUDGET_TRACEBACK" in err[1]
    # any other RuntimeError keeps its traceback, a distributed one that names no gone peer too (a timeout)
    with pytest.raises(RuntimeError, match="bad"):
        main(lambda: (_ for _ in ()).throw(RuntimeError("bad")))

    class DistBackendError(RuntimeError):
        pass

    with pytest.raises(DistBackendError, match="Watchdog caught collective operation timeout"):
        main(lambda: (_ for _ in ()).throw(DistBackendError("Watchdog caught collective operation timeout")))
