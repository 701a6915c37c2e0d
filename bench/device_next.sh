#!/bin/bash
# Prepared in session 5 (2026-12-06) for the next GPU call (not run: no device time left): the decode parts on a set
# with many videos in flight (3 copies of the 6-video set: 18 videos, 3 of them 30 minutes of 1080p), with and
# without parts, records compared; the first run fills the Inductor cache (read the two later ones). Then the
# records of decoder=cpu against auto on the videos up to 8 minutes (the 30-minute file's CPU decode alone takes
# minutes; its frames are equal by hash, session 2). Last, the decode pool on 6 copies of the set (16 workers, the
# session-2 mix: NVDEC 67 % busy, full Video-MME simulated 1.10 h) with the parts and without.
#   bash bench/device_next.sh
set -u
. bench/device_site.sh
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
echo "== the CLI, 3 copies of the set: parts on (cold), on, off"
timeout 420 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 8 --cli --cli-copies 3 \
  --cli-decoders auto auto auto/decode_part_mb=0 --json "$OUT/cli_copies.json" > "$OUT/cli_copies.txt" 2>&1
echo "rc $?"; grep -E "^CLI|records identical|Traceback|Error" "$OUT/cli_copies.txt" | cut -c1-1500 | head -24
stamp "cli copies"
echo "== records: decoder=cpu vs auto, videos up to 8 minutes"
timeout 170 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 8 --cli --cli-max-s 500 \
  --cli-decoders auto cpu --json "$OUT/cli_cpu_auto.json" > "$OUT/cli_cpu_auto.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*videos|records identical|Traceback|Error" "$OUT/cli_cpu_auto.txt" | cut -c1-600 | head -8
stamp "cpu vs auto"
echo "== the decode pool, 6 copies of the set, 16 workers: parts (256 MB), then whole"
for pm in 256 0; do
  extra=$([ "$pm" != 0 ] && echo "--part-mb $pm")
  timeout 150 python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 16 --copies 6 $extra \
    --json "$OUT/mix_parts$pm.json" > "$OUT/mix_parts$pm.txt" 2>&1
  echo "rc $? (part-mb $pm)"; grep -E "^nvdec: busy|simulated|Video-MME" "$OUT/mix_parts$pm.txt" | cut -c1-500 | head -8
  stamp "mix part-mb $pm"
done
