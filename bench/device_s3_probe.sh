#!/bin/bash
# 2026-12-04 (session 3), a short GPU call: why the first step compiles 6 graphs that the early compilation made
# (TORCH_LOGS=recompiles on one cold CLI run prints each recompiled graph's failed guard).
#   bash bench/device_s3_probe.sh   (carry .whl)
set -u
. bench/device_site.sh
V=/tmp/fa_videos; python3 bench/cli_throughput.py --make-videos $V --n-videos 3 > $OUT/make.log 2>&1
stamp "videos made"
TORCH_LOGS=recompiles,graph_breaks timeout 150 python3 bench/cli_throughput.py --videos $V --n-videos 3 > "$OUT/fa_recompiles.log" 2>&1
grep -E "^(first answer|steady step)|^warm-up" "$OUT/fa_recompiles.log" | cut -c1-600
grep -n -A8 -i "recompil\|graph break" "$OUT/fa_recompiles.log" | cut -c1-400 | head -150
stamp done
