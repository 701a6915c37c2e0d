#!/bin/bash
# Session 7, call 3 (2026-12-06), on the tree with data.num_workers null (16 workers on this 16-core host) and
# parts only for spare workers (within_spare_workers): the user's CLI with its defaults on the whole set at full
# length against decoder=cpu (records compared: the exactness target), then on 3 copies of the set.
#   bash bench/device_s7_call3.sh          (no carry needed)
set -u
. bench/device_site.sh
( python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; import cli_throughput as ct; \
ct.write_checkpoint(Path('/tmp/workload_cli/videollama3-7b-random'))" > "$OUT/ckpt.txt" 2>&1 ) &
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; wait; stamp "set made, checkpoint written"
timeout $(( 370 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 16 --cli --cli-decoders auto cpu/decode_threads=16 --json "$OUT/cli_cpu_auto.json" \
  > "$OUT/cli_cpu_auto.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|busy)|records identical|differs|Traceback|Error" "$OUT/cli_cpu_auto.txt" | cut -c1-600 | head -16
stamp "cpu vs auto"
timeout $(( 515 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 16 --cli --cli-copies 3 --cli-decoders auto --json "$OUT/cli_copies.json" > "$OUT/cli_copies.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|busy)|Traceback|Error" "$OUT/cli_copies.txt" | cut -c1-600 | head -8
stamp "copies"
