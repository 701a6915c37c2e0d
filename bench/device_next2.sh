#!/bin/bash
# Prepared in session 17 for the next session's second call (after bench/device_next.sh): the figures of issue 41
# not re-measured since: (1) the extraction rows (session 10: `window` 56-61 % of the compute ceiling, `sliding`
# 58 %); (2) bench/qa_throughput.py --paths bcd at 4k and 16k, kernels: triton, on s1 (session 15: (d)/floor 1.66
# at 16k, 0.539 s at 4k), then s2 and m1 (not run since session 10).
#   bash bench/device_next2.sh                            (carry .whl)
set -u
. bench/device_site.sh
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set"
timeout 200 python3 bench/extract_throughput.py --modes completed-block-hold --sessions 16 \
  --memory-policy window sliding --reprefill-slides auto --json "$OUT/extract.json" > "$OUT/extract.txt" 2>&1
echo "rc $?"; tail -12 "$OUT/extract.txt" | cut -c1-260; stamp "extraction"
timeout $(( 380 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 --kernels triton \
  --paths bcd --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 --json "$OUT/qa_s1.json" > "$OUT/qa_s1.txt" 2>&1
echo "rc $?"; grep -E "^s1|b=c|c=d" "$OUT/qa_s1.txt" | cut -c1-300; stamp "QA bench, s1"
timeout $(( 570 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 --kernels triton \
  --paths bcd --videos /tmp/wl/s2_h264_720p2997_g250_90s.mp4 /tmp/wl/m1_h264_720p30_g250_480s.mp4 \
  --json "$OUT/qa_s2m1.json" > "$OUT/qa_s2m1.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/qa_s2m1.txt" | cut -c1-300; stamp "QA bench, s2 and m1"
bundle_out
