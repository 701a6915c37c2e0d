#!/bin/bash
# One GPU-machine session's measurements in one command (issues 31 / 33), in the order they are needed:
#   bash bench/device_session.sh            (on the lent H200; writes under $OUT when it is set)
# 1. tests/test_gpu.py (the graph decode tests run again since the 2026-12-03 keep-alive fix: pass => decode
#    auto can become graph); 2. import times of the CLI; 3. the Video-MME-shaped set on NVDEC at full length with
#    the CPU / NVDEC / SM busy shares sampled (what bounds the decode); 4. the user's CLI on the short videos,
#    cold then warm compile caches, with timeline_s (first worker start, first decode window, early compile).
# Without network the wheels come from .whl/site312.tar.xz (built on the CPU machine, see docs/performance.md).
set -u
. bench/device_site.sh
python3 -m models.videollama3.tiny >/dev/null 2>&1; stamp "site + tiny model"
echo "== 1. GPU tests"
timeout 400 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 | tail -15
stamp "gpu tests"
echo "== 2. import times (python -X importtime -c 'import cli', twice)"
import_times
echo "== 3+4. workload: NVDEC pool at full length (busy shares) + the CLI cold (cpu decoder) then warm (auto)"
timeout 480 python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 8 --cli --cli-max-s 130 \
  --cli-decoders cpu auto --json "$OUT/workload.json" 2>&1 \
  | grep -v -E "^\s*(videomme|acc%|±95|  videomme|  robust|differences|scores:|report:)" | tail -40
stamp "workload"
