"""models.mps: the run's own MPS control daemon (TOKENBUDGET_MPS: auto by default, 1, 0), with a stand-in control
program that records how it was called (no GPU or MPS here)."""
import os
import stat
from pathlib import Path

import pytest

import models.mps as mps
from models.mps import watch_and_stop   # (the real one: the fixture stands another in for start_mps)


@pytest.fixture
def control(tmp_path, monkeypatch):
    """A stand-in ``nvidia-cuda-mps-control``: appends its arguments, its stdin and its pipe folder to a log; exits
    with the code in ``$FAKE_MPS_RC`` (default 0)."""
    log = tmp_path / "calls.log"
    exe = tmp_path / "nvidia-cuda-mps-control"
    exe.write_text("#!/bin/sh\nin=$(cat 2>/dev/null </dev/stdin)\n"
                   f"echo \"args=$* stdin=$in pipe=$CUDA_MPS_PIPE_DIRECTORY\" >> {log}\n"
                   "[ -n \"$FAKE_MPS_RC\" ] && echo 'An instance of this daemon is already running' >&2\n"
                   "exit ${FAKE_MPS_RC:-0}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(mps, "predict_on_nvidia_machine", lambda argv, switch: argv[:1] == ["predict"])
    monkeypatch.delenv(mps.PIPE_ENV, raising=False)
    monkeypatch.delenv(mps.LOG_ENV, raising=False)
    registered = []   # the watchers started: (control, folder, pid)
    monkeypatch.setattr(mps, "watch_and_stop", lambda exe, folder, pid: registered.append((exe, folder, pid)))
    return exe, log, registered


@pytest.mark.parametrize("switch", [None, "auto", "1"])
def test_starts_a_daemon_of_its_own_and_a_watcher_for_this_process(control, monkeypatch, switch):
    exe, log, registered = control
    if switch is None:                                             # the default: started where the program is
        monkeypatch.delenv(mps.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(mps.ENV_SWITCH, switch)
    folder = mps.start_mps(["predict", "--config", "x.yaml"], control=str(exe))
    assert folder is not None and Path(folder).is_dir()
    assert os.environ[mps.PIPE_ENV] == folder and os.environ[mps.LOG_ENV] == folder   # the run's processes inherit it
    assert log.read_text().splitlines() == [f"args=-d stdin= pipe={folder}"]
    assert registered == [(str(exe), folder, os.getpid())]


def test_the_watcher_quits_the_daemon_once_the_run_has_ended_however_it_ended(control, tmp_path):
    """The run's process killed outright (no exit handler runs): the daemon is told to quit and its folder removed
    all the same, and not before the process is gone."""
    import signal
    import subprocess
    import time

    exe, log, _ = control
    folder = tmp_path / "pipe"
    folder.mkdir()
    run = subprocess.Popen(["sleep", "60"])
    watcher = watch_and_stop(str(exe), str(folder), run.pid, poll_s=0.1)
    time.sleep(0.5)                                                # several looks while the run lives
    assert watcher.poll() is None and folder.is_dir() and not log.exists()
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert watcher.wait(timeout=30) == 0
    assert log.read_text().splitlines() == [f"args= stdin=quit pipe={folder}"]
    assert not folder.exists()


@pytest.mark.parametrize("case", ["switch off", "not predict", "already a client"])
def test_nothing_started(control, monkeypatch, case):
    exe, log, registered = control
    monkeypatch.setenv(mps.ENV_SWITCH, "0" if case == "switch off" else "1")
    if case == "already a client":
        monkeypatch.setenv(mps.PIPE_ENV, "/tmp/someone-elses-daemon")
    argv = ["fit"] if case == "not predict" else ["predict"]
    assert mps.start_mps(argv, control=str(exe)) is None
    assert not log.exists() and registered == []


def test_a_daemon_that_does_not_start_is_one_line_and_the_run_goes_on(control, monkeypatch, capsys):
    exe, log, registered = control
    monkeypatch.setenv(mps.ENV_SWITCH, "1")
    monkeypatch.setenv("FAKE_MPS_RC", "1")
    assert mps.start_mps(["predict"], control=str(exe)) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not start (An instance of this daemon is already running)" in err[0]
    assert mps.PIPE_ENV not in os.environ and registered == []


@pytest.mark.parametrize("switch", [None, "1"])
def test_no_control_program(control, monkeypatch, capsys, switch):
    """Asked for (``1``): one line; by default: nothing said (most machines have no MPS)."""
    if switch is None:
        monkeypatch.delenv(mps.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(mps.ENV_SWITCH, switch)
    monkeypatch.setattr(mps.shutil, "which", lambda name: None)
    assert mps.start_mps(["predict"]) is None
    err = capsys.readouterr().err
    if switch == "1":
        assert err.strip() == "TOKENBUDGET_MPS=1: no nvidia-cuda-mps-control on PATH; running without MPS"
    else:
        assert err == ""
    assert mps.PIPE_ENV not in os.environ


def test_a_bad_switch_value_stops_the_run_before_anything_runs(tmp_path):
    """``evaluate.py`` with ``TOKENBUDGET_MPS=yes``: one line naming the variable and the values it takes, rc 2,
    nothing written."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, mps.ENV_SWITCH: "yes"}
    r = subprocess.run([sys.executable, str(repo / "evaluate.py"), "predict"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "evaluate.py: TOKENBUDGET_MPS='yes': auto (default), 1 or 0; nothing was run or written"]
    assert list(tmp_path.iterdir()) == []
