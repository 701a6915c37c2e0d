#!/bin/bash
# Prepared in sessions 17-18 for the next session's first call; ran as session 19's call 1 (session 18 got no
# device machine: every start was refused). One call, ~560 s:
#   (1) the GPU tests beside the set's making (BudgetedQA releases the VLM at predict end; the MPS watcher);
#   (2) the feed, which bounds the full Video-MME (session 17's projection: 0.80 h against 0.54 h of steps; ~14,000
#       source frames/s needed, 10,685 measured in session 8's 18-video pool with 16 workers, NVDEC 64 % busy, CPUs
#       42 %): the same pool (3 copies, every video whole) with nvdec / 16 workers, then data.cpu_slots (session 18:
#       idle cores read files NVDEC would, `--paths hybrid`) with 20 workers and 4 slots of 2 threads, then nvdec with
#       20 workers (the worker count alone), then hybrid with 22 workers and 6 slots;
#   (3) the user's CLI on the workload-shaped set: defaults, then cpu_slots=4 with 20 workers (records compared), and
#       process_s - predict_end (session 17 call 4: 15.2 s, 10.0 s of it Lightning's teardown copying the 7B weights
#       to the CPU, which the release at predict end removes: expect ~5 s).
# Then bench/device_next2.sh (extraction, QA bench).
#   bash bench/device_next.sh                             (carry .whl)
set -u
. bench/device_site.sh
gpu_tests_start
set_and_checkpoint
gpu_tests_report
pool() {   # $1: label, $2: deadline (s after the start), $3: path, $4: workers, $5: CPU slots
  timeout $(( $2 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths "$3" \
    --workers "$4" --cpu-slots "${5:-0}" --copies 3 --part-mb 0 --json "$OUT/pool_$1.json" > "$OUT/pool_$1.txt" 2>&1
  echo "rc $? ($1)"; grep -E "busy while decoding|every worker was busy|full Video-MME" "$OUT/pool_$1.txt" \
    | grep -v "^  " | cut -c1-330
  echo "  videos on a CPU slot: $(grep -c 'CPU slot' "$OUT/pool_$1.txt")"
  stamp "pool $1"
}
pool nvdec16 230 nvdec 16
pool hybrid20k4 295 hybrid 20 4
pool nvdec20 360 nvdec 20
pool hybrid22k6 425 hybrid 22 6
export TRITON_CACHE_DIR=/tmp/triton_cli
CLI_END=580 workload_cli cli . auto auto/cpu_slots=4/num_workers=20
grep -o '"process_s": [0-9.]*\|"predict_end": [0-9.]*\|"cuda_mps_pipe": [^,]*' "$OUT/cli_cli.json" | head -12
bundle_out
