#!/bin/bash
# Session 9, call 1 (2026-12-06): (1) the user's CLI on the whole set with the defaults as they now are (the first
# video read on the CPU when it is under data.first_video_cpu_mpx): cold (fills the compile cache), off (mpx 0,
# warm), on again (warm); records compared; (2) import times of the CLI; (3) streaming extraction, window policy,
# re-prefills of 1 slide vs the runner's default K (never measured on a GPU).
#   bash bench/device_s9_call1.sh          (carry .whl)
set -u
. bench/device_site.sh
set_and_checkpoint
timeout $(( 330 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 16 --cli --cli-decoders auto auto/first_video_cpu_mpx=0 auto --json "$OUT/cli.json" > "$OUT/cli.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|timeline|busy)|records identical|differing fields|Traceback|Error|first video" \
  "$OUT/cli.txt" | cut -c1-620 | head -24
stamp "CLI cold / off / on"
import_times
timeout $(( 570 - ($(date +%s) - T0) )) python3 bench/extract_throughput.py --modes completed-block-hold \
  --sessions 16 --memory-policy window --reprefill-slides 1 auto --fuse-slide-rows --json "$OUT/extract.json" \
  > "$OUT/extract.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/extract.txt" | cut -c1-300
stamp "extraction"
