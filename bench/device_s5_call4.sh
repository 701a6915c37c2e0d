#!/bin/bash
# 2026-12-06 (session 5), fourth GPU call (the device time left: ~300 s): call 3's parts runs again with the join
# starting the loader's workers when the trainer asks for its iterator (in call 3 they started after the weight
# load, 3-4 s late). The user's CLI on the whole set, parts on (cold), then on (warm); records compared.
#   bash bench/device_s5_call4.sh
set -u
. bench/device_site.sh
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
echo "== the CLI on the whole set: parts on (cold), on (warm)"
timeout 200 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 8 --cli \
  --cli-decoders auto auto --json "$OUT/cli_parts.json" > "$OUT/cli_parts.txt" 2>&1
echo "rc $?"; grep -E "^CLI|records identical|Traceback|Error" "$OUT/cli_parts.txt" | cut -c1-1200 | head -24
stamp "cli"
