"""datamodules/worker_watch.py: a decode worker ends itself once the run's process is gone (it would otherwise
finish its video first), and lowers its priority when asked."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from datamodules.worker_watch import EXIT_CODE, process_alive, start_decode_worker, worker_init

REPO = Path(__file__).resolve().parents[2]


def test_process_alive_sees_the_living_and_not_the_dead_or_zombies():
    assert process_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:            # exited but not reaped: a zombie counts as gone
        with open(f"/proc/{child.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.02)
    assert not process_alive(child.pid)
    child.wait()
    assert not process_alive(child.pid)           # reaped: no such process


def test_the_watch_ends_its_process_once_the_run_process_is_gone():
    """A child watching a process that exits ends with EXIT_CODE within a poll or two; while the watched process
    lives, the child goes on."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    code = (f"import time; from datamodules.worker_watch import watch_run_process; "
            f"watch_run_process({sleeper.pid}, poll_s=0.05); time.sleep(30); print('outlived')")
    t0 = time.monotonic()
    watcher = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    sleeper.wait()
    assert watcher.returncode == EXIT_CODE and "outlived" not in watcher.stdout
    assert 0.9 < time.monotonic() - t0 < 10      # not before the watched process ended, not after the 30 s sleep


RUN = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from datamodules.videoqa import video_loader

    class SlowVideos:                      # a worker "decoding" a long video: its pid, then 60 s of work
        def __len__(self):
            return 2
        def __getitem__(self, i):
            with open(os.path.join({folder!r}, f"worker{{os.getpid()}}"), "w") as f:
                f.write(str(os.nice(0)))
            time.sleep(60)
            return i

    for item in video_loader(SlowVideos(), None, num_workers=2, prefetch_factor=1, worker_niceness=3):
        pass
""")


def test_decode_workers_end_soon_after_the_run_is_killed(tmp_path):
    """The run's process (the user's CLI) killed outright while both decode workers are mid-video: the workers end
    within seconds instead of finishing their 60 s items; each ran at the niceness asked for."""
    run = subprocess.Popen([sys.executable, "-c", RUN.format(repo=str(REPO), folder=str(tmp_path))],
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("worker*"))) < 2:
            assert time.monotonic() < deadline and run.poll() is None, "the workers did not start"
            time.sleep(0.05)
        time.sleep(0.2)
        workers = [int(p.name[len("worker"):]) for p in tmp_path.glob("worker*")]
        nice_run = os.getpriority(os.PRIO_PROCESS, run.pid)
        assert [int(p.read_text()) for p in tmp_path.glob("worker*")] == [nice_run + 3] * 2
        assert all(process_alive(w) for w in workers)
        run.send_signal(signal.SIGKILL)
        run.wait()
        deadline = time.monotonic() + 10
        while any(process_alive(w) for w in workers):
            assert time.monotonic() < deadline, "a decode worker outlived the run by 10 s"
            time.sleep(0.05)
    finally:
        if run.poll() is None:
            run.kill()


def test_worker_init_binds_this_process_and_the_niceness():
    init = worker_init(4, 7)
    assert init.func is start_decode_worker and init.args == (os.getpid(), 7)
    assert worker_init(0, 7) is None
