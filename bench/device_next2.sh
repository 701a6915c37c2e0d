#!/bin/bash
# Prepared in session 9 (2026-12-06): (1) streaming extraction, completed-block-hold, 16 sessions, window policy:
# re-prefills of 1 slide against the runner's default K, slide rows fused (never measured on a GPU), with the
# compute ceiling columns; (2) bench/qa_throughput.py at 4k and 16k on three videos of the workload-shaped set (made
# here with PyAV's encoders): (d) against its floor, part by part, and the token check between the paths (issue 41's
# QA rows; not measured since 2026-12-02).
#   bash bench/device_next2.sh                             (carry .whl)
set -u
. bench/device_site.sh
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
timeout 240 python3 bench/extract_throughput.py --modes completed-block-hold --sessions 16 --memory-policy window \
  --reprefill-slides 1 auto --fuse-slide-rows --json "$OUT/extract.json" > "$OUT/extract.txt" 2>&1
echo "rc $?"; tail -24 "$OUT/extract.txt" | cut -c1-300
stamp "extraction"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 \
  --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 /tmp/wl/s2_h264_720p2997_g250_90s.mp4 \
  /tmp/wl/m1_h264_720p30_g250_480s.mp4 --json "$OUT/qa.json" > "$OUT/qa.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/qa.txt" | cut -c1-300
stamp "QA bench"
