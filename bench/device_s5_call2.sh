#!/bin/bash
# 2026-12-06 (session 5), second GPU call: the user's CLI on the whole set (6 videos at full length, decoder=auto)
# with long videos decoded in parts (data.decode_part_mb, new; default 256 MB) and without (decode_part_mb=0), the
# records compared byte for byte; the first run fills the Inductor cache, so the last three runs are warm.
#   bash bench/device_s5_call2.sh
set -u
. bench/device_site.sh
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
ls -la /tmp/wl | awk '{print $5, $9}'
echo "== the CLI on the whole set: parts on (cold: fills the cache), then off, on, off (warm)"
timeout 440 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 8 --cli \
  --cli-decoders auto auto/decode_part_mb=0 auto auto/decode_part_mb=0 --json "$OUT/cli_parts.json" > "$OUT/cli_parts.txt" 2>&1
echo "rc $?"; grep -E "^CLI|records identical|Traceback|Error" "$OUT/cli_parts.txt" | cut -c1-1200 | head -24
stamp "cli"
