#!/bin/bash
# 2026-12-04 (session 3), second GPU call: the GPU tests (graph decode through reused decode slots, the bounded
# prefix part), then the user's CLI with the compile thread's thread count fixed and one graph per shape bucket:
# first answer cold (3 videos) and warm (6 videos: the steady step over 5), and one profiled steady QA step.
#   bash bench/device_s3_call2.sh   (carry .whl)
set -u
. bench/device_site.sh
python3 -c "import torch; print(\"torch\", torch.__version__, torch.version.cuda)"
echo "== GPU tests"
NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_gpu.py tests/datamodules/test_nvdec.py 2>&1 | grep -E "passed|failed|Error|^E " | head -30
stamp "gpu tests"
V=/tmp/fa_videos; python3 bench/cli_throughput.py --make-videos $V --n-videos 6 > $OUT/make.log 2>&1
stamp "videos made"
for run in "cold 3" "warm 6"; do
  set -- $run
  echo "== CLI, $1 ($2 videos)"
  timeout 130 python3 bench/cli_throughput.py --videos $V --n-videos $2 > "$OUT/fa_$1.log" 2>&1
  grep -E "^(records|model load|first answer|first-video wait|first video|steady step per video)|^timeline|^warm-up|^\[rank" \
    "$OUT/fa_$1.log" | cut -c1-900
  stamp "$1"
done
echo "== profiled QA step"
timeout 170 python3 bench/qa_step_profile.py --videos $V/*.mp4 > $OUT/qa_step_profile.txt 2>&1
echo "rc $?"; grep -vE "^\s*$" $OUT/qa_step_profile.txt | grep -v "^ " | tail -45 | cut -c1-200
stamp "profile"
