#!/bin/bash
# Session 13, call 1 (one start may be all this session gets: 400 s of device time went to refused starts): the most
# needed of bench/device_next.sh and device_next2.sh in one call, files in $OUT:
#   (1) the GPU tests (two changed in session 12 for the GELU rule, not yet run on a GPU);
#   (2) the user's CLI on the whole workload-shaped set (a Triton cache of its own, empty at first): the defaults
#       (now with the compressor's first-call warm-up and the CUDA context made beside the imports; cold), then
#       model.weight_reader=pinned with data.first_video_threads=6, the defaults, each of the two alone, and
#       TOKENBUDGET_EARLY_CUDA=0 (the context made by the module, as before); records compared;
#   (3) the QA bench (paths b, c, d) at 4k and 16k on one video: b=c now that (c)'s vision MLP rounds as the
#       library's, and where b and c part (encoder rows, fused kernels, the library's own SDPA-backend spread).
#   bash bench/device_s13_call1.sh                        (carry .whl; CLI_END / END: seconds after the start; CLI_RUNS)
# As run (H100, after ~1,100 s of refused starts; files bench/results/s13call{1,2}_*_h100_2026-12-06.*):
#   call 1: CLI_END=300 END=330 CLI_RUNS="auto auto/model.weight_reader=pinned/first_video_threads=6 auto \
#           auto/model.weight_reader=pinned/first_video_threads=6" bash bench/device_s13_call1.sh
#           (GPU tests 43 passed; three CLI runs, the fourth and the QA bench cut by the limits)
#   call 2, the same warm machine: . bench/device_site.sh; TRITON_CACHE_DIR=/tmp/triton_cli python3 bench/workload.py
#           --videos /tmp/wl --paths nvdec --only short --workers 16 --cli --cli-decoders
#           auto/model.weight_reader=pinned/first_video_threads=6 auto auto/model.weight_reader=pinned
#           auto/first_video_threads=6 --json $OUT/cli2.json
set -u
. bench/device_site.sh
gpu_tests_start
set_and_checkpoint
gpu_tests_report
export TRITON_CACHE_DIR=/tmp/triton_cli
timeout $(( ${CLI_END:-380} - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 16 --cli --cli-decoders ${CLI_RUNS:-auto auto/model.weight_reader=pinned/first_video_threads=6 auto auto/model.weight_reader=pinned \
  auto/first_video_threads=6 auto/env.TOKENBUDGET_EARLY_CUDA=0} \
  --json "$OUT/cli.json" > "$OUT/cli.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|stages|timeline)|records identical|differing fields|Traceback|Error" \
  "$OUT/cli.txt" | sed 's/warm-up.*//' | cut -c1-520 | head -30
stamp "CLI"
unset TRITON_CACHE_DIR
timeout $(( ${END:-585} - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 --kernels triton \
  --paths bcd --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 --json "$OUT/qa_s1.json" > "$OUT/qa_s1.txt" 2>&1
echo "rc $?"; grep -E "^s1|b=c|c=d|b vs c|^GEMM" "$OUT/qa_s1.txt" | cut -c1-300; stamp "QA bench, one video"
