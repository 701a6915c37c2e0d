#!/bin/bash
# 2026-12-06 (session 6), third GPU call. Call 2 ran out of time in its decoder=cpu run on the whole set (the 30-minute
# 1080p file on the CPU), and bench/workload.py printed nothing of its earlier runs (now each run prints as it ends).
# Here: the records of decoder=auto against decoder=cpu on the videos up to 8 minutes (the 30-minute file's frames
# are equal by hash, session 2); then the user's CLI on 3 copies of the whole set (18 videos in flight: a queue, as
# in a benchmark run), parts on and off, warm; then the decode pool on 6 copies with parts if time is left.
#   bash bench/device_s6_call3.sh
set -u
. bench/device_site.sh
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
echo "== records: decoder=auto vs cpu (8 threads per worker), videos up to 8 minutes"
timeout 170 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 8 --cli --cli-max-s 500 \
  --cli-decoders auto cpu/decode_threads=8 --json "$OUT/cli_cpu_auto.json" > "$OUT/cli_cpu_auto.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*videos,|records identical|differs|Traceback|Error" "$OUT/cli_cpu_auto.txt" | cut -c1-900 | head -12
stamp "cpu vs auto"
echo "== the CLI, 3 copies of the set: parts on, off (warm)"
timeout $(( 470 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 8 --cli --cli-copies 3 --cli-decoders auto auto/decode_part_mb=0 --json "$OUT/cli_copies.json" \
  > "$OUT/cli_copies.txt" 2>&1
echo "rc $?"; grep -E "^CLI|records identical|differs|Traceback|Error" "$OUT/cli_copies.txt" | cut -c1-1500 | head -16
stamp "cli copies"
left=$(( 490 - ($(date +%s) - T0) ))
if [ $left -gt 90 ]; then
  echo "== the decode pool, 6 copies, 16 workers, parts of 256 MB"
  timeout $left python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 16 --copies 6 --part-mb 256 \
    --json "$OUT/mix_parts256.json" > "$OUT/mix_parts256.txt" 2>&1
  echo "rc $?"; grep -E "^nvdec: busy|simulated|Video-MME|steady" "$OUT/mix_parts256.txt" | cut -c1-500 | head -8
  stamp "mix"
fi
