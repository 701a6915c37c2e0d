#!/bin/bash
# 2026-12-04, third GPU call, after the merges of issue 44 (bounded answer batches, legacy-container frames, display
# matrices) and the review (the YUV->RGB converter's buffers reused): the GPU tests, the user's CLI first answer and
# steady step (twice: the compile cache cold, then warm), and the decode pool on the mix.
#   bash bench/device_call3.sh   (carry .whl: the wheels and .whl/nvdec_clips)
set -u
. bench/device_site.sh
echo "== GPU tests"
NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_gpu.py tests/datamodules/test_nvdec.py 2>&1 | tail -8
stamp "gpu tests"
V=/tmp/fa_videos; python3 bench/cli_throughput.py --make-videos $V --n-videos 3 > $OUT/make.log 2>&1
cli_runs $V cold warm
python3 bench/workload.py --make /tmp/wl 2>&1 | tail -1; stamp "set made"
echo "== mix: the set x 3 in flight, 16 workers"
timeout 150 python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 16 --copies 3 --json "$OUT/mix.json" \
  > "$OUT/mix.txt" 2>&1
grep -E "pool of|busy while|not decoded|simulated|aggregate|needs" "$OUT/mix.txt" | cut -c1-300 | head -12
grep -E "check_s" "$OUT/mix.txt" | sed -E "s/.*(l1|m1|m2|s1|s2|s3)_([a-z0-9]+).*'check_s': ([0-9.]+).*/\1 check \3/" | tr '\n' ' '
stamp "mix"
