#!/bin/bash
# Prepared in session 9 (2026-12-06): bench/qa_throughput.py at 4k and 16k on three videos of the workload-shaped
# set (made here with PyAV's encoders): (d) against its floor, part by part, and the token check between the paths
# (what issue 41's QA rows ask; not measured since 2026-12-03).
#   bash bench/device_next2.sh                             (carry .whl)
set -u
. bench/device_site.sh
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 \
  --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 /tmp/wl/s2_h264_720p2997_g250_90s.mp4 \
  /tmp/wl/m1_h264_720p30_g250_480s.mp4 --json "$OUT/qa.json" > "$OUT/qa.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/qa.txt" | cut -c1-300
stamp "QA bench"
