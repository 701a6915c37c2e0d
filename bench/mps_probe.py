"""Is a run's own CUDA MPS daemon (``models/mps.py``) safe to start by default? Two questions, on a GPU machine:

    python bench/mps_probe.py                 # prints one line per case and a table

1. **Two runs at once**, each with a daemon of its own (private pipe folders, as ``models.mps.start_mps`` makes
   them): client A (daemon 1) runs bf16 matmuls for ``--long-s`` seconds; client B (daemon 2) starts 1 s later and
   runs them for 2 s. If B ends before A, the two daemons' clients share the GPU; if B ends only after A (or times
   out), a second daemon's clients wait for the first's.
2. **A fatal fault in one client**: A runs matmuls (a synchronize per iteration) for ``--long-s`` seconds while B
   triggers a device-side assert (an out-of-range index) 2 s in. Under one daemon, and without MPS for reference.
   Does A survive B's fault? (Without MPS each process has a context of its own and A should.)

3. **How long ``quit`` takes while a client lives**: a client holds its context for ``--long-s`` s; 1.5 s in, the
   control program is told ``quit``; the seconds until it returns (``models.mps.stop_mps`` no longer waits for it).

Each client is a fresh ``python -c`` process; a case's clients are given ``--timeout-s`` seconds.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

CLIENT = r"""
import sys, time, torch
role, run_s, delay = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
t0 = time.time()
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print(f"{role} ready {time.time() - t0:.2f}", flush=True)
time.sleep(delay)
if role == "fault":
    idx = torch.tensor([2**40], device="cuda")    # far out of range: the index kernel's device-side assert
    y = x.view(-1)[idx]
    torch.cuda.synchronize()
    print(f"{role} no fault?", flush=True)
else:
    n, t1 = 0, time.time()
    while time.time() - t1 < run_s:
        x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
        n += 1
    print(f"{role} done {n} matmuls in {time.time() - t1:.2f} s (ended at {time.time():.2f})", flush=True)
"""


def daemon(control: str) -> tuple[str, dict]:
    folder = tempfile.mkdtemp(prefix="mps-probe-")
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": folder, "CUDA_MPS_LOG_DIRECTORY": folder}
    r = subprocess.run([control, "-d"], env=env, capture_output=True, text=True, timeout=15)
    print(f"daemon {folder}: rc {r.returncode} {r.stderr.strip()[-200:]}", flush=True)
    return folder, env


def stop(control: str, folder: str, env: dict) -> None:
    subprocess.run([control], input="quit\n", env=env, capture_output=True, text=True, timeout=15)
    log = os.path.join(folder, "server.log")
    if os.path.isfile(log):
        tail = open(log).read().strip().splitlines()[-4:]
        print("  server.log: " + " | ".join(tail)[:600], flush=True)
    shutil.rmtree(folder, ignore_errors=True)


def clients(specs: list[tuple[str, dict, float, float, float]], timeout_s: float) -> dict:
    """``specs``: (role, env, run_s, delay_s, start_after_s); returns role -> (rc, end s, last lines)."""
    t0, procs = time.time(), {}   # (epoch seconds: the clients print theirs)
    for role, env, run_s, delay, after in specs:
        while time.time() - t0 < after:
            time.sleep(0.05)
        procs[role] = subprocess.Popen([sys.executable, "-c", CLIENT, role, str(run_s), str(delay)], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = {}
    for role, p in procs.items():
        try:
            text, _ = p.communicate(timeout=max(1.0, timeout_s - (time.time() - t0)))
            rc = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            text, rc = p.communicate()[0], "timeout"
        ended = re.findall(r"ended at ([0-9.]+)", text)   # the client's own clock (epoch s); else now
        end = round((float(ended[-1]) if ended else time.time()) - t0, 2)
        out[role] = (rc, end, " | ".join(text.strip().splitlines()[-2:])[-300:])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long-s", type=float, default=8.0)
    ap.add_argument("--timeout-s", type=float, default=45.0)
    ap.add_argument("--cases", nargs="+", default=["two", "fault", "quit"], choices=["two", "fault", "quit"])
    args = ap.parse_args()
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise SystemExit("no nvidia-cuda-mps-control on PATH")
    plain = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    rows = []

    if "quit" in args.cases:
        f1, e1 = daemon(control)
        t0 = time.time()
        p = subprocess.Popen([sys.executable, "-c", CLIENT, "long", str(args.long_s), "0"], env=e1,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(1.5)
        tq = time.time()
        q = subprocess.run([control], input="quit\n", env=e1, capture_output=True, text=True, timeout=120)
        quit_s, quit_at = time.time() - tq, time.time() - t0
        text, _ = p.communicate(timeout=args.timeout_s)
        print(f"== quit while a client lives: quit returned rc {q.returncode} after {quit_s:.2f} s ({quit_at:.2f} s "
              f"after the client's start); client rc {p.returncode}: {text.strip().splitlines()[-1][:200]}",
              flush=True)
        stop(control, f1, e1)
    if "two" in args.cases:
        f1, e1 = daemon(control)
        f2, e2 = daemon(control)
        r = clients([("long", e1, args.long_s, 0, 0), ("short", e2, 2.0, 0, 1.0)], args.timeout_s)
        stop(control, f1, e1)
        stop(control, f2, e2)
        rows.append(("two daemons, one client each", r))
    if "fault" in args.cases:
        f1, e1 = daemon(control)
        r = clients([("long", e1, args.long_s, 0, 0), ("fault", e1, 0, 2.0, 0)], args.timeout_s)
        stop(control, f1, e1)
        rows.append(("one daemon, B faults", r))
        r = clients([("long", plain, args.long_s, 0, 0), ("fault", plain, 0, 2.0, 0)], args.timeout_s)
        rows.append(("no MPS, B faults", r))

    for name, r in rows:
        print(f"== {name}")
        for role, (rc, end, text) in r.items():
            print(f"  {role:6s} rc {rc!s:8s} ended {end:6.2f} s  {text}")


if __name__ == "__main__":
    main()
