#!/bin/bash
# Session 10 (2026-12-06), second call: (1) bench/aoti_probe.py: AOTInductor packages of the fused kernels at the 7B
# sizes: build seconds, then in a fresh process the load seconds against torch.compile's first call, equality with
# the compiled kernels, time per call; (2) bench/qa_throughput.py at 4k and 16k on three videos of the
# workload-shaped set: (d) against its floor, part by part, and the token check between the paths.
#   bash bench/device_s10_call2.sh                  (carry .whl)
set -u
. bench/device_site.sh
( python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1 ) &
timeout 260 python3 bench/aoti_probe.py --dir /tmp/aoti --json "$OUT/aoti.json" > "$OUT/aoti.txt" 2>&1
echo "rc $?"; grep -v "^W1\|^  warnings\|UserWarning" "$OUT/aoti.txt" | tail -30 | cut -c1-400
stamp "AOTI probe"
wait; stamp "set made"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 \
  --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 /tmp/wl/s2_h264_720p2997_g250_90s.mp4 \
  /tmp/wl/m1_h264_720p30_g250_480s.mp4 --json "$OUT/qa.json" > "$OUT/qa.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/qa.txt" | cut -c1-300
stamp "QA bench"
