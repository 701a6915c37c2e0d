#!/bin/bash
# Session 17, call 1 (session 16's bench/device_next.sh, re-timed: session 16's runs were cut by too-tight
# deadlines). One bench/workload.py call (one pool bench, one set) runs six CLI variants on the whole
# workload-shaped set, 16 workers, one Triton cache (cold in the first run), fresh processes:
#   auto (cold), auto under its own MPS daemon (TOKENBUDGET_MPS=1), auto, MPS again: the defaults against MPS,
#   records compared with the first run's; then steps 2, 3, 5 under callbacks.step_profile without and with MPS
#   (kernel time, GPU idle, the step thread's run-queue wait, in the run and alone at the end).
# The GPU tests are left out (nothing of theirs changed since they passed in session 15).
#   bash bench/device_s17_call1.sh                        (carry .whl)
set -u
. bench/device_site.sh
set_and_checkpoint
export TRITON_CACHE_DIR=/tmp/triton_cli
P=env.BENCH_STEP_PROFILE=2,3,5 M=env.TOKENBUDGET_MPS=1
CLI_END=570 workload_cli ab . auto auto/$M auto auto/$M auto/$P auto/$M/$P
step_profile_summary "$OUT/cli_ab.json" 600
bundle_out
