"""bench/start_sampler.py: every thread's stack sampled from the interpreter's start, around a script run as
``__main__``; the summary's spans and the plot's activities from hand-made stacks."""
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import load_bench_script

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "start_sampler.py"


def _bench():
    return load_bench_script("start_sampler")


def test_a_script_is_sampled_thread_by_thread(tmp_path):
    """A script with a named thread busy in one function and the main thread in another: both threads' samples,
    their innermost frames named, the script run as ``__main__`` with its own arguments."""
    script = tmp_path / "busy.py"
    script.write_text(
        "import sys, threading, time\n"
        "def spin(s):\n"
        "    end = time.perf_counter() + s\n"
        "    while time.perf_counter() < end:\n"
        "        pass\n"
        "def helper():\n"
        "    spin(0.4)\n"
        "if __name__ == '__main__':\n"
        "    t = threading.Thread(target=helper, name='helper')\n"
        "    t.start()\n"
        "    spin(0.4)\n"
        "    t.join()\n"
        "    print('args', sys.argv[1:])\n")
    out = tmp_path / "s.json"
    run = subprocess.run([sys.executable, str(BENCH), "--out", str(out), "--interval-ms", "5", "--", str(script),
                          "a", "b"], capture_output=True, text=True, check=True)
    assert "args ['a', 'b']" in run.stdout
    data = json.loads(out.read_text())
    names = {n for _, n, _ in data["samples"]}
    assert {"MainThread", "helper"} <= names
    leaves = {(n, data["stacks"][sid][-1].rsplit("/", 1)[-1]) for _, n, sid in data["samples"]}
    assert ("helper", "busy.py:spin") in leaves and ("MainThread", "busy.py:spin") in leaves
    helper = [[k.rsplit("/", 1)[-1] for k in data["stacks"][sid]] for _, n, sid in data["samples"] if n == "helper"]
    assert any(s[-2:] == ["busy.py:helper", "busy.py:spin"] for s in helper)   # outermost first
    text = _bench().summary(data, {"timeline_s": {"half": 0.2}}, 0.5)
    assert "## thread helper" in text and "busy.py:spin" in text


def test_activities_and_spans_by_hand(tmp_path):
    bench = _bench()
    assert bench.activity(["evaluate.py:<module>", ".12/threading.py:wait"]) is None                  # waiting
    assert bench.activity(["x.py:f", "<frozen importlib._bootstrap>:_find_and_load", "sympy/core.py:<module>"]) \
        == "imports"
    assert bench.activity(["models/weight_reader.py:work", "x.py:f"]) == "weight read"
    assert bench.activity(["models/videollama3/warm.py:run", "triton/runtime/cache.py:triton_key"]) == "Triton"
    assert bench.activity(["cli.py:main", "evaluate.py:cli_main"]) == "other"
    # 4 main-thread samples: 2 before the mark "a" (both in f), 2 after (g under f once)
    data = {"interval_s": 0.01, "stacks": [["m.py:f"], ["m.py:f", "m.py:g"]],
            "samples": [[0.1, "MainThread", 0], [0.2, "MainThread", 0], [0.6, "MainThread", 1],
                        [0.7, "MainThread", 0]]}
    text = bench.summary(data, {"timeline_s": {"a": 0.5, "b": 0.9}}, 1.0)
    after = text.split("## main thread a 0.50 -> b 0.90 s (0.40 s, 2 samples)")[1]
    assert "100%  m.py:f" in after and " 50%  m.py:g" in after
    bench.plot(data, {"timeline_s": {"a": 0.5}}, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
