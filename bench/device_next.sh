#!/bin/bash
# Prepared in session 9 (2026-12-06) for the next session's first call (session 9's device time was spent on its
# CLI runs): what issue 41's table still lacks on a GPU, in one call.
# (1) the GPU tests (tests/test_gpu.py, tests/datamodules/test_nvdec.py with the clips carried);
# (2) streaming extraction, completed-block-hold, 16 sessions, window policy: re-prefills of 1 slide against the
#     runner's default K, slide rows fused (never measured on a GPU), with the compute ceiling columns;
# (3) bench/qa_throughput.py at 4k and 16k on three videos of the workload-shaped set (made here with PyAV's encoders):
#     (d) against its floor, the token check between the paths.
#   python bench/make_nvdec_clips.py .whl/nvdec_clips     (on the CPU machine, once)
#   bash bench/device_next.sh                             (carry .whl; NVDEC_TEST_CLIPS reads .whl/nvdec_clips)
set -u
. bench/device_site.sh
export NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips
( timeout 170 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/test_gpu.py \
    tests/datamodules/test_nvdec.py > "$OUT/gpu_tests.txt" 2>&1 ) &
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
wait; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu_tests.txt" | head -12; stamp "gpu tests"
timeout 200 python3 bench/extract_throughput.py --modes completed-block-hold --sessions 16 --memory-policy window \
  --reprefill-slides 1 auto --fuse-slide-rows --json "$OUT/extract.json" > "$OUT/extract.txt" 2>&1
echo "rc $?"; tail -24 "$OUT/extract.txt" | cut -c1-300
stamp "extraction"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 \
  --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 /tmp/wl/s2_h264_720p2997_g250_90s.mp4 \
  /tmp/wl/m1_h264_720p30_g250_480s.mp4 --json "$OUT/qa.json" > "$OUT/qa.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/qa.txt" | cut -c1-300
stamp "QA bench"
