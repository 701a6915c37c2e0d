#!/bin/bash
# Prepared in session 6 (2026-12-06; not run): the records of decoder=auto against decoder=cpu on the whole set at
# full length (the exactness target; sessions 5-6 ran out of time on the CPU decode of the 30-minute 1080p file,
# 135 s with 8 threads per worker on the H100). Both runs on one machine (one kernel cache): the fields that differ
# are printed per record.
#   bash bench/device_next_records.sh
set -u
. bench/device_site.sh
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 8 --cli --cli-decoders auto cpu/decode_threads=8 --json "$OUT/cli_cpu_auto.json" \
  > "$OUT/cli_cpu_auto.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*videos,|records identical|differs|Traceback|Error" "$OUT/cli_cpu_auto.txt" | cut -c1-900 | head -12
stamp "cpu vs auto"
