#!/bin/bash
# Prepared in session 17 for the next session's first call (session 16's version ran as bench/device_s17_call1.sh).
#   (1) the GPU tests beside the set's making (BudgetedQA now releases the VLM at predict end; the MPS watcher);
#   (2) the user's CLI, defaults (the run's own MPS daemon), whole workload-shaped set, twice: the first answer cold
#       and warm, and process_s - predict_end (session 17 call 4: 15.2 s, 10.0 s of it Lightning's teardown copying
#       the 7B weights to the CPU, which the release removes: expect ~5 s);
#   (3) the feed, which now bounds the full benchmark: with 2.15 s steps the full Video-MME needs ~14,000 source
#       frames/s to keep the GPU busy, the pool's steady rate was 10,685 (session 8, NVDEC 64 % busy; projected
#       0.80 h against 0.54 h of steps). The 18-video pool (16 workers, every video whole) as in session 8, then the
#       same with 24 workers, and with 16 under an MPS daemon (do the workers' per-frame copy kernels run faster as
#       one context?).
# Then bench/device_next2.sh (extraction, QA bench).
#   bash bench/device_next.sh                             (carry .whl)
set -u
. bench/device_site.sh
gpu_tests_start
set_and_checkpoint
gpu_tests_report
export TRITON_CACHE_DIR=/tmp/triton_cli
CLI_END=280 workload_cli defaults . auto auto
grep -o '"process_s": [0-9.]*\|"predict_end": [0-9.]*\|"cuda_mps_pipe": [^,]*' "$OUT/cli_defaults.json" | head -12
unset TRITON_CACHE_DIR
pool() {   # $1: label, $2: deadline (s after the start), $3: workers (16); the 18-video pool of session 8 call 1
  timeout $(( ${2:-400} - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec \
    --workers "${3:-16}" --copies 3 --part-mb 0 --json "$OUT/pool_$1.json" > "$OUT/pool_$1.txt" 2>&1
  echo "rc $? ($1)"; grep -E "busy while decoding|every worker was busy|full Video-MME" "$OUT/pool_$1.txt" | cut -c1-300
  stamp "pool $1"
}
pool plain 400
pool w24 480 24     # more sessions in flight on the 7 engines (the CPUs were 42 % busy with 16)
MPSDIR=$(mktemp -d) && CUDA_MPS_PIPE_DIRECTORY=$MPSDIR CUDA_MPS_LOG_DIRECTORY=$MPSDIR nvidia-cuda-mps-control -d \
  && { ( export CUDA_MPS_PIPE_DIRECTORY=$MPSDIR CUDA_MPS_LOG_DIRECTORY=$MPSDIR; pool mps 560 )
       echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPSDIR nvidia-cuda-mps-control; }
bundle_out
