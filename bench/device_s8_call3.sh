#!/bin/bash
# Session 8, call 3 (2026-12-06): the GPU tests, then where today's QA step goes on this machine
# (bench/qa_step_profile.py with the background compilation as the CLI runs it: the first step's stages and host
# profile, steady steps on unseen videos, one step under torch.profiler, the host's waits, cuDNN on seen videos),
# then the user's CLI (bench/cli_throughput.py, defaults, 3 videos) cold and warm for the first answer.
#   bash bench/device_s8_call3.sh          (carry .whl/nvdec_clips)
set -u
. bench/device_site.sh
export NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips
V=/tmp/fa_videos
( python3 bench/cli_throughput.py --make-videos $V --n-videos 3 > "$OUT/make_videos.log" 2>&1 ) &
timeout 200 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/test_gpu.py \
  tests/datamodules/test_nvdec.py > "$OUT/gpu_tests.txt" 2>&1
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu_tests.txt" | head -12; wait; stamp "gpu tests; videos made"
timeout 230 python3 bench/qa_step_profile.py --early-compile --videos $V/*.mp4 > "$OUT/qa_step_profile.txt" 2>&1
echo "rc $?"; grep -E "^(warm-up|steady|## profiled|GPU busy|host stage|suffix|step |encode|compress|decode|prefill|kernel time|same video|seen video|host waits)" \
  "$OUT/qa_step_profile.txt" | cut -c1-220 | head -40
stamp "profile"
cli_runs $V cold warm
