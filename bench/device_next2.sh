#!/bin/bash
# Prepared in session 12 for the next session's second call, cut down in session 13: the kernel check at the 7B
# sizes (its new row: the vision MLP's fc1 + tanh GELU, the library's two kernels under triton / eager against the
# one epilogue GEMM under inductor: GPU ms and share of outputs differing), the load probe (the raw read against the
# read through page-locked buffers by 4 and 8 threads, and transformers' load), then bench/qa_throughput.py --paths
# bcd (without the slow harness path (a)) at 4k and 16k with kernels: triton on one video (does b=c hold now that
# (c)'s vision MLP rounds as the library's? session 12 call 2: logits 0.15-0.18 apart on every row, with the
# epilogue; the row now says where b and c part: encoder rows, fused kernels, and the library's own SDPA-backend
# spread), then two more videos.
# Session 15 ran the QA bench on s1 only (b=c still apart: logits 0.145-0.182, c=d equal); the kernel check, the
# load probe and the two other videos are still to run, and the extraction figures (session 10) to re-measure:
#   timeout 150 python3 bench/extract_throughput.py --modes completed-block-hold --sessions 16 \
#     --memory-policy window sliding --reprefill-slides auto --json "$OUT/extract.json"
#   bash bench/device_next2.sh                            (carry .whl)
set -u
. bench/device_site.sh
set_and_checkpoint
timeout 120 python3 bench/triton_kernels_check.py --json "$OUT/triton_check.json" > "$OUT/triton_check.txt" 2>&1
echo "rc $?"; tail -8 "$OUT/triton_check.txt" | cut -c1-220; stamp "kernel check"
timeout 90 python3 bench/load_probe.py --model-dir /tmp/workload_cli/videollama3-7b-random \
  --variants raw_safetensors pinned_threads_4 pinned_threads_8 device_map > "$OUT/load_probe.txt" 2>&1
echo "rc $?"; tail -6 "$OUT/load_probe.txt" | cut -c1-200; stamp "load probe"
timeout $(( 330 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 --kernels triton \
  --paths bcd --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 --json "$OUT/qa_s1_triton.json" > "$OUT/qa_s1_triton.txt" 2>&1
echo "rc $?"; grep -E "^s1|b=c|c=d|b vs c" "$OUT/qa_s1_triton.txt" | cut -c1-300; stamp "QA bench, one video"
timeout $(( 560 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 --kernels triton \
  --paths bcd --videos /tmp/wl/s2_h264_720p2997_g250_90s.mp4 /tmp/wl/m1_h264_720p30_g250_480s.mp4 --json "$OUT/qa_s2m1.json" \
  > "$OUT/qa_s2m1.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/qa_s2m1.txt" | cut -c1-300; stamp "QA bench, two more"
bundle_out
