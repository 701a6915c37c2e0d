#!/bin/bash
# Session 8, call 2 (2026-12-06): (1) the first video read on the CPU (data.first_video_cpu_mb, new): the user's CLI
# on the whole set with the defaults, off (0) and on (64), the first run cold, the others warm, records compared
# (the first video's may differ only in the reader's fields); (2) the engines' capacity over a longer window with
# every worker busy: the workload pool on NVDEC, 16 workers, 6 copies of the whole set (36 videos, whole), the
# full Video-MME simulated at call 1's steady CLI step (2.15 s, H100).
#   bash bench/device_s8_call2.sh          (no carry needed)
set -u
. bench/device_site.sh
( python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; import cli_throughput as ct; \
ct.write_checkpoint(Path('/tmp/workload_cli/videollama3-7b-random'))" > "$OUT/ckpt.txt" 2>&1 ) &
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; wait; stamp "set made, checkpoint written"
timeout 330 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 16 --cli \
  --cli-decoders auto/first_video_cpu_mb=0 auto auto/first_video_cpu_mb=0 auto --json "$OUT/cli_first.json" \
  > "$OUT/cli_first.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|busy|timeline)|records identical|differing fields|Traceback|Error|first video" \
  "$OUT/cli_first.txt" | cut -c1-520 | head -30
stamp "first video on the CPU, off / on"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 16 \
  --copies 6 --part-mb 0 --gpu-step-s '{"short": 2.15, "medium": 2.15, "long": 2.15}' --json "$OUT/pool6.json" \
  > "$OUT/pool6.txt" 2>&1
echo "rc $? (pool, 6 copies)"; grep -E "full Video-MME|  same,|busy while|M source frames" "$OUT/pool6.txt" | cut -c1-300
stamp "pool"
