#!/bin/bash
# 2026-12-04 (session 2), last GPU call, on the merged tree: the GPU tests, then the user's CLI first answer and
# steady step with the start moved to the module's build and the early compilation made for the load thread's plain
# weights (cold cache, then warm).
#   bash bench/device_s2_call3.sh   (carry .whl: the wheels and .whl/nvdec_clips)
set -u
. bench/device_site.sh
echo "== GPU tests"
NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_gpu.py tests/datamodules/test_nvdec.py 2>&1 | tail -8
stamp "gpu tests"
V=/tmp/fa_videos; python3 bench/cli_throughput.py --make-videos $V --n-videos 3 > $OUT/make.log 2>&1
stamp "videos made"
for name in cold warm; do
  echo "== CLI, $name"
  timeout 110 python3 bench/cli_throughput.py --videos $V --n-videos 3 > "$OUT/fa_$name.log" 2>&1
  grep -E "^(records|model load|first answer|first-video wait|first video|steady step per video, mean)|^timeline|^warm-up" \
    "$OUT/fa_$name.log" | cut -c1-900
  stamp "$name"
done
