#!/bin/bash
# 2026-12-04 (session 3), last GPU call: the decode step's prefix attention split by hand over 512-key chunks
# (call 2: the unsplit variable-length kernel took 281 us per layer and step), checked by the GPU tests, then the
# user's CLI cold (3 videos: first answer and steady step) and one profiled steady QA step.
#   bash bench/device_s3_call3.sh   (carry .whl)
set -u
. bench/device_site.sh
echo "== GPU tests (tests/test_gpu.py)"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 | grep -E "passed|failed|Error|^E " | head -20
stamp "gpu tests"
V=/tmp/fa_videos; python3 bench/cli_throughput.py --make-videos $V --n-videos 3 > $OUT/make.log 2>&1
stamp "videos made"
echo "== CLI, cold (3 videos)"
timeout 120 python3 bench/cli_throughput.py --videos $V --n-videos 3 > "$OUT/fa_cold.log" 2>&1
grep -E "^(records|model load|first answer|first video|steady step per video)|^timeline|^warm-up|^\[rank" \
  "$OUT/fa_cold.log" | cut -c1-900
stamp "cold"
echo "== profiled QA step"
timeout 100 python3 bench/qa_step_profile.py --videos $V/*.mp4 > $OUT/qa_step_profile.txt 2>&1
echo "rc $?"; grep -E "^(steady|## profiled|GPU busy|host stage|suffix|step |encode|compress|decode|prefill|kernel time|void|same video|seen video)" \
  $OUT/qa_step_profile.txt | cut -c1-200 | head -40
stamp "profile"
