#!/bin/bash
# Session 16, call 1 (session 15's bench/device_next.sh, extended). Files in $OUT (bundled out.tgz):
#   (0) is CUDA MPS at hand (nvidia-cuda-mps-control), the GPU's compute mode;
#   (1) (the GPU tests: left out, see below);
#   (2) the user's CLI on the whole workload-shaped set, 16 workers, one Triton cache (cold in the first run), fresh
#       processes: session 15's code before the first video's NVDEC stream-only check (e977863, carried as .old)
#       and after, alternated (the first answer);
#   (3) the same CLI with steps 2, 3 (beside the long files' decode) and 5 (l1, decoding over) under the profiler
#       and again alone at the end (callbacks.step_profile: kernel time, GPU idle, the host thread's run-queue wait):
#       what bounds the steady step in the user's run;
#   (4) where MPS is at hand, the CLI with a control daemon started for it (one GPU context shared by the decode
#       workers and the step: no time-slicing between them);
#   records of every run against old2's (bench/workload.py; decoder fields left out).
# Make .old first:  mkdir -p .old && git archive e977863 -- algorithms bench callbacks configs datamodules \
#   lightning_modules models evaluate.py cli.py train.py pyproject.toml ':!bench/results' ':!bench/media' \
#   | tar -x -C .old   (and add /.old/ to .git/info/exclude)
#   bash bench/device_s16_call1.sh                        (carry .whl and .old)
set -u
. bench/device_site.sh
{ command -v nvidia-cuda-mps-control nvidia-smi; nvidia-smi -q | grep -iE "compute mode|product name" | head -4; nproc; } \
  2>&1 | tee "$OUT/mps_check.txt"
# (the GPU tests passed in session 15 and nothing of theirs changed since: left out to fit the call)
set_and_checkpoint
export TRITON_CACHE_DIR=/tmp/triton_cli
CLI_END=150 workload_cli new1 . auto      # (first: the Triton cache cold, against the new code)
CLI_END=225 BENCH_STEP_PROFILE=2,3,5 workload_cli prof . auto
python3 - "$OUT/cli_prof.json" <<'PY' 2>&1 | tee "$OUT/prof_summary.txt"
import json, sys
for run in json.load(open(sys.argv[1]))["cli_runs"].values():
    for s in run.get("step_profile") or []:
        for k in ("run", "alone"):
            r = s.get(k) or {}
            print(s["step"], s.get("video_id"), k, {x: r.get(x) for x in ("wall_s", "busy_ms", "kernel_ms", "gap_ms",
                  "host_cpu_s", "host_runqueue_s", "by_class_ms")})
        print("   ratio", json.dumps(s.get("ratio"))[:600])
PY
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p /tmp/mps_pipe /tmp/mps_log
  nvidia-cuda-mps-control -d && stamp "MPS daemon started"
  CLI_END=285 workload_cli mps . auto
  echo quit | nvidia-cuda-mps-control; sleep 1
  tail -5 /tmp/mps_log/control.log /tmp/mps_log/server.log 2>/dev/null | cut -c1-200 > "$OUT/mps_log.txt"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
CLI_END=345 workload_cli old1 .old auto   # (last: it runs only if the call's time allows; old2/new2 left out)
for n in prof mps old1; do   # records of each run against new1's (the decoder fields left out)
  [ -f "$OUT/cli_$n.json" ] || continue
  python3 -c "import json, sys; sys.path.insert(0, 'bench'); import workload as w; o = lambda l: w.Path(json.load(open(
f'$OUT/cli_{l}.json'))['cli_runs']['auto']['out']); print('$n vs new1:', *w.compare_records(o('new1'), o('$n')))"
done
bundle_out
