#!/bin/bash
# Prepared in session 12 for the next session's second call: the kernel check at the 7B sizes (its new row: the
# vision MLP's fc1 + tanh GELU, the library's two kernels under triton / eager against the one epilogue GEMM under
# inductor: GPU ms and share of outputs differing), then bench/qa_throughput.py at 4k and 16k on one video of the
# set with kernels: triton: does b=c hold now that (c)'s vision MLP rounds as the library's (session 12 call 2:
# logits 0.15-0.18 apart on every row, with the epilogue), then on two more if time is left.
#   bash bench/device_next2.sh                            (carry .whl)
set -u
. bench/device_site.sh
set_and_checkpoint
timeout 120 python3 bench/triton_kernels_check.py --json "$OUT/triton_check.json" > "$OUT/triton_check.txt" 2>&1
echo "rc $?"; tail -8 "$OUT/triton_check.txt" | cut -c1-220; stamp "kernel check"
timeout $(( 330 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 --kernels triton \
  --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 --json "$OUT/qa_s1.json" > "$OUT/qa_s1.txt" 2>&1
echo "rc $?"; grep -E "^s1|b=c|a=b|c=d" "$OUT/qa_s1.txt" | cut -c1-300; stamp "QA bench, one video"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 --kernels triton \
  --videos /tmp/wl/s2_h264_720p2997_g250_90s.mp4 /tmp/wl/m1_h264_720p30_g250_480s.mp4 --json "$OUT/qa_s2m1.json" \
  > "$OUT/qa_s2m1.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/qa_s2m1.txt" | cut -c1-300; stamp "QA bench, two more"
