#!/bin/bash
# 2026-12-06 (session 5), fourth GPU call (call 3 again, with the join starting the loader's workers when the trainer asks for its iterator: they started after the weight load in call 3). Call 2 showed a long video's 8 parts filling all 8 workers, so the short
# videos after it waited (13.5 s); now at most half the workers take one video's parts and each worker holds one
# item at a time. The user's CLI on the whole set: parts on (cold), on (warm), off (warm); records compared.
#   bash bench/device_s5_call4.sh
set -u
. bench/device_site.sh
export NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
echo "== the CLI on the whole set: parts on (cold), on (warm), off (warm)"
timeout 330 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 8 --cli \
  --cli-decoders auto auto auto/decode_part_mb=0 --json "$OUT/cli_parts.json" > "$OUT/cli_parts.txt" 2>&1
echo "rc $?"; grep -E "^CLI|records identical|Traceback|Error" "$OUT/cli_parts.txt" | cut -c1-1200 | head -24
stamp "cli"
