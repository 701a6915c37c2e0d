#!/bin/bash
# Prepared in session 7 (2026-12-06; not run): the decode capacity with the CLI's new worker count, for the issue's
# full Video-MME simulation (session 7's lines came from a pool of the short videos only). The workload pool on
# NVDEC with 16 workers over 3 copies of the whole set (18 videos in flight, the 30-minute files whole and in
# parts), printed with the simulation at the CLI's steady step of session 7 (2.32 s, H100); the GPU tests first.
#   bash bench/device_next.sh          (carry .whl/nvdec_clips)
set -u
. bench/device_site.sh
export NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips
( timeout 200 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/test_gpu.py \
    tests/datamodules/test_nvdec.py > "$OUT/gpu_tests.txt" 2>&1 ) &
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
wait; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu_tests.txt" | head -12; stamp "gpu tests (first: the pools measure the engines alone)"
for part in 0 256; do
  timeout $(( 390 + 190 * (part > 0) - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl \
    --paths nvdec --workers 16 --copies 3 --part-mb $part \
    --gpu-step-s '{"short": 2.32, "medium": 2.32, "long": 2.32}' --json "$OUT/pool_parts$part.json" \
    > "$OUT/pool_parts$part.txt" 2>&1
  echo "rc $? (part_mb $part)"; grep -E "full Video-MME|  same,|NVDEC busy|nvdec " "$OUT/pool_parts$part.txt" | cut -c1-300 | head -10
  stamp "pool, part_mb $part"
done
