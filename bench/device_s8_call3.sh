#!/bin/bash
# Session 8, call 3 (2026-12-06; cut to the device time left after failed starts): the user's CLI with the defaults (the first video read on the CPU) on the whole set, cold
# (one run: the device time left).
#   bash bench/device_s8_call3.sh          (no carry needed)
set -u
. bench/device_site.sh
( python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; import cli_throughput as ct; \
ct.write_checkpoint(Path('/tmp/workload_cli/videollama3-7b-random'))" > "$OUT/ckpt.txt" 2>&1 ) &
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; wait
stamp "set made, checkpoint written"
timeout $(( 215 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 16 --cli --cli-decoders auto --json "$OUT/cli_defaults.json" > "$OUT/cli_defaults.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|timeline|busy)|records identical|Traceback|Error|first video" \
  "$OUT/cli_defaults.txt" | cut -c1-520 | head -12
stamp "CLI defaults, cold"
