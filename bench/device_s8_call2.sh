#!/bin/bash
# Session 8, call 2 (2026-12-06): (1) the engines' capacity over a longer all-workers-busy window: the workload pool
# on NVDEC, 16 workers, 6 copies of the whole set (36 videos, every video whole), the full Video-MME simulated at
# call 1's steady CLI step (2.15 s, H100); (2) where today's step goes on this machine: bench/qa_step_profile.py
# (the background compilation as the CLI runs it, then steady steps on unseen videos and one under the profiler).
#   bash bench/device_s8_call2.sh          (no carry needed)
set -u
. bench/device_site.sh
V=/tmp/fa_videos
( python3 bench/cli_throughput.py --make-videos $V --n-videos 3 > "$OUT/make_videos.log" 2>&1 ) &
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; wait; stamp "sets made"
timeout 200 python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 16 --copies 6 --part-mb 0 \
  --gpu-step-s '{"short": 2.15, "medium": 2.15, "long": 2.15}' --json "$OUT/pool6.json" > "$OUT/pool6.txt" 2>&1
echo "rc $? (pool, 6 copies)"; grep -E "full Video-MME|  same,|busy while|M source frames" "$OUT/pool6.txt" | cut -c1-300
stamp "pool"
timeout $(( 570 - ($(date +%s) - T0) )) python3 bench/qa_step_profile.py --early-compile --videos $V/*.mp4 \
  > "$OUT/qa_step_profile.txt" 2>&1
echo "rc $?"; grep -E "^(warm-up|steady|## profiled|GPU busy|host stage|suffix|step |encode|compress|decode|prefill|kernel time|same video|seen video|host waits)" \
  "$OUT/qa_step_profile.txt" | cut -c1-220 | head -40
stamp "profile"
