#!/bin/bash
# Prepared in session 16 for the next session's first call. Session 16's one call (bench/device_s16_call1.sh) gave each
# CLI run ~60 s, too little: bench/workload.py benches the decode pool (~10 s) before its CLI runs, so every run was cut
# after predicting and no JSON was written. Here one workload.py call runs several variants after one pool bench:
#   (1) the defaults against TOKENBUDGET_MPS=1 (the run's own MPS daemon), alternated, records compared with the
#       first run's (bench/workload.py prints "records identical"): model work per video, first answer, waits;
#   (2) the defaults with steps 2, 3, 5 under callbacks.step_profile (kernel time, GPU idle, the step thread's wait
#       for a CPU, in the run and alone at the end), then the same under MPS;
#   (3) if time is left: session 15's code (.old, e977863) against this one, for the first video's NVDEC
#       stream-only check.
# Make .old first (only for (3)):  mkdir -p .old && git archive e977863 -- algorithms bench callbacks configs \
#   datamodules lightning_modules models evaluate.py cli.py train.py pyproject.toml ':!bench/results' \
#   ':!bench/media' | tar -x -C .old   (and add /.old/ to .git/info/exclude)
#   bash bench/device_next.sh                             (carry .whl, and .old for (3))
set -u
. bench/device_site.sh
gpu_tests_start
set_and_checkpoint
gpu_tests_report
export TRITON_CACHE_DIR=/tmp/triton_cli
CLI_END=330 workload_cli mps . auto auto/env.TOKENBUDGET_MPS=1 auto auto/env.TOKENBUDGET_MPS=1
CLI_END=470 BENCH_STEP_PROFILE=2,3,5 workload_cli prof . auto auto/env.TOKENBUDGET_MPS=1
python3 - "$OUT/cli_prof.json" <<'PY' 2>&1 | tee "$OUT/prof_summary.txt"
import json, sys
for name, run in json.load(open(sys.argv[1]))["cli_runs"].items():
    for s in run.get("step_profile") or []:
        for k in ("run", "alone"):
            r = s.get(k) or {}
            print(name, s["step"], s.get("video_id"), k, {x: r.get(x) for x in ("wall_s", "busy_ms", "kernel_ms",
                  "gap_ms", "host_cpu_s", "host_runqueue_s", "by_class_ms")})
        print("   ratio", json.dumps(s.get("ratio"))[:600])
PY
[ -d .old ] && CLI_END=580 workload_cli old .old auto
bundle_out
