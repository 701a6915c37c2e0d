#!/bin/bash
# Session 17, call 2: (1) bench/mps_probe.py: two runs' own MPS daemons at once, and a fatal fault in one client
# beside another (under one daemon and without MPS): may the run's daemon be the default? (2) the CLI on the whole
# workload-shaped set under MPS, the Triton cache cold (the first answer cold), then steps 2, 3, 5 under
# callbacks.step_profile under MPS (call 1's sixth run, cut there).
#   bash bench/device_s17_call2.sh                        (carry .whl)
set -u
. bench/device_site.sh
python3 bench/mps_probe.py 2>&1 | tee "$OUT/mps_probe.txt"
stamp "mps probe"
set_and_checkpoint
export TRITON_CACHE_DIR=/tmp/triton_cli
P=env.BENCH_STEP_PROFILE=2,3,5 M=env.TOKENBUDGET_MPS=1
CLI_END=450 workload_cli mps . auto/$M auto/$M/$P
python3 - "$OUT/cli_mps.json" <<'PY' 2>&1 | tee "$OUT/prof_summary.txt"
import json, sys
for name, run in json.load(open(sys.argv[1]))["cli_runs"].items():
    for s in run.get("step_profile") or []:
        for k in ("run", "alone"):
            r = s.get(k) or {}
            print(name, s["step"], s.get("video_id"), k, {x: r.get(x) for x in ("wall_s", "busy_ms", "kernel_ms",
                  "gap_ms", "host_cpu_s", "host_runqueue_s", "by_class_ms")})
        print("   ratio", json.dumps(s.get("ratio"))[:300])
PY
bundle_out
