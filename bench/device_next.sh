#!/bin/bash
# Prepared in session 17 for the next session's first call (session 16's version ran as bench/device_s17_call1.sh).
#   (1) the GPU tests beside the set's making (BudgetedQA now releases the VLM at predict end);
#   (2) the user's CLI, defaults (the run's own MPS daemon), whole workload-shaped set, twice: the first answer cold
#       and warm, and process_s - predict_end (session 17 call 4: 15.2 s, 10.0 s of it Lightning's teardown copying
#       the 7B weights to the CPU, which the release removes: expect ~5 s);
#   (3) the extraction rows, not re-measured since session 10 (56-61 % of the compute ceiling);
#   (4) with the time left, the QA bench on s1 (session 15: (d)/floor 1.66 at 16k, 0.539 s at 4k).
#   bash bench/device_next.sh                             (carry .whl)
set -u
. bench/device_site.sh
gpu_tests_start
set_and_checkpoint
gpu_tests_report
export TRITON_CACHE_DIR=/tmp/triton_cli
CLI_END=260 workload_cli defaults . auto auto
grep -o '"process_s": [0-9.]*\|"predict_end": [0-9.]*' "$OUT/cli_defaults.json" | head -8
unset TRITON_CACHE_DIR
timeout $(( 420 - ($(date +%s) - T0) )) python3 bench/extract_throughput.py --modes completed-block-hold \
  --sessions 16 --memory-policy window sliding --reprefill-slides auto --json "$OUT/extract.json" \
  > "$OUT/extract.txt" 2>&1
echo "rc $?"; tail -12 "$OUT/extract.txt" | cut -c1-260; stamp "extraction"
left=$(( 560 - ($(date +%s) - T0) ))
[ $left -gt 60 ] && { timeout $left python3 bench/qa_throughput.py --budgets 4096 16384 --kernels triton --paths bcd \
  --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 --json "$OUT/qa_s1.json" > "$OUT/qa_s1.txt" 2>&1
  echo "rc $?"; grep -E "^s1|b=c|c=d" "$OUT/qa_s1.txt" | cut -c1-300; stamp "QA bench, one video"; }
bundle_out
