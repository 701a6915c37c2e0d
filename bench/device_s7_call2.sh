#!/bin/bash
# Session 7, call 2 (2026-12-06): is the NVDEC feed bound by the worker count? Call 1 (8 workers, 3 copies of the
# set) had the 8 workers busy while NVDEC was busy 46-50 % on average (p90 96-100 %): the user's CLI on 3 copies of
# the set with 16, 8, 16 without parts and 12 workers, records compared.
#   bash bench/device_s7_call2.sh          (no carry needed)
set -u
. bench/device_site.sh
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 8 --cli --cli-copies 3 --json "$OUT/cli_workers.json" \
  --cli-decoders auto/num_workers=16 auto auto/num_workers=16/decode_part_mb=0 auto/num_workers=12 \
  > "$OUT/cli_workers.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|busy)|records identical|differs|Traceback|Error" "$OUT/cli_workers.txt" | cut -c1-600 | head -24
stamp "cli workers"
