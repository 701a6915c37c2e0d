#!/bin/bash
# Session 18, first call (the H100/H200 lent): does data.cpu_slots (idle cores read beside the NVDEC engines) raise
# the feed, which bounds the full Video-MME (session 17's projection: 0.80 h against 0.54 h of steps; ~14,000 source
# frames/s needed, 10,685 measured in session 8's 18-video pool, NVDEC 64 % busy, CPUs 42 %)?
#   (1) the GPU tests in the background while the set is made;
#   (2) the 18-video pool (session 8's: 3 copies, every video whole): nvdec with 16 workers, hybrid with 20 workers
#       and 4 CPU slots of 2 threads, nvdec with 20 workers (the worker count alone);
#   (3) the user's CLI on the workload-shaped set, defaults (the time left allows one run; the
#       run's end after predict_end: the release of the VLM and the MPS watcher, first time on a GPU).
#   bash bench/device_s18_call1.sh                        (carry .whl)
set -u
. bench/device_site.sh
gpu_tests_start
set_and_checkpoint
gpu_tests_report
pool() {   # $1: label, $2: deadline (s after the start), $3: path, $4: workers, $5: CPU slots
  timeout $(( $2 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths "$3" \
    --workers "$4" --cpu-slots "${5:-0}" --copies 3 --part-mb 0 --json "$OUT/pool_$1.json" > "$OUT/pool_$1.txt" 2>&1
  echo "rc $? ($1)"; grep -E "busy while decoding|every worker was busy|full Video-MME|CPU slot" "$OUT/pool_$1.txt" \
    | grep -v "^  " | cut -c1-330
  echo "  videos on a CPU slot: $(grep -c 'CPU slot' "$OUT/pool_$1.txt")"
  stamp "pool $1"
}
pool nvdec16 230 nvdec 16
pool hybrid20k4 290 hybrid 20 4
pool nvdec20 350 nvdec 20
export TRITON_CACHE_DIR=/tmp/triton_cli
CLI_END=430 workload_cli cli . auto
grep -o '"process_s": [0-9.]*\|"predict_end": [0-9.]*\|"cuda_mps_pipe": [^,]*' "$OUT/cli_cli.json" | head -12
bundle_out
