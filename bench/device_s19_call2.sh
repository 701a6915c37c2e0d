#!/bin/bash
# Session 19, call 2 (after bench/device_next.sh as call 1): (1) the GPU tests with the NVDEC clips carried
# (.whl/nvdec_clips, made on the CPU machine by `python -m tests.datamodules.test_nvdec .whl/nvdec_clips`; call 1
# lacked them: 18 errors); (2) PyNvVideoCodec's WARN lines of a WebM read, with LOGGER_LEVEL unset (the run sets
# ERROR) and =WARN; (3) bench/device_next2.sh's rows: extraction, then the QA bench at 4k and 16k on s1, s2, m1.
#   bash bench/device_s19_call2.sh                        (carry .whl; QA_END=N: the QA bench on s1 only, until N s)
set -u
. bench/device_site.sh
export NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips
timeout 150 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/test_gpu.py \
  tests/datamodules/test_nvdec.py > "$OUT/gpu_tests.txt" 2>&1
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu_tests.txt" | head -12; stamp "gpu tests"
warn_lines() {   # $1: LOGGER_LEVEL value or "unset"
  local code="from datamodules.decode import nvdec; f = nvdec.read_nvdec('$NVDEC_TEST_CLIPS/vp9_320x240.webm', \
list(range(0, 20, 2)), (240, 320), 0, 4); print('frames', f.shape)"
  if [ "$1" = unset ]; then env -u LOGGER_LEVEL python3 -c "$code" > "$OUT/warn_$1.txt" 2>&1
  else LOGGER_LEVEL=$1 python3 -c "$code" > "$OUT/warn_$1.txt" 2>&1; fi
  echo "LOGGER_LEVEL $1: rc $?, $(grep -c '\[WARN' "$OUT/warn_$1.txt") WARN lines;" \
    "$(grep -v '\[WARN' "$OUT/warn_$1.txt" | tail -2 | cut -c1-200)"
}
warn_lines unset; warn_lines WARN; stamp "WARN lines"
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set"
timeout 170 python3 bench/extract_throughput.py --modes completed-block-hold --sessions 16 \
  --memory-policy window sliding --reprefill-slides auto --json "$OUT/extract.json" > "$OUT/extract.txt" 2>&1
echo "rc $?"; tail -12 "$OUT/extract.txt" | cut -c1-260; stamp "extraction"
timeout $(( ${QA_END:-400} - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 \
  --kernels triton --paths bcd --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 --json "$OUT/qa_s1.json" \
  > "$OUT/qa_s1.txt" 2>&1
echo "rc $?"; grep -E "^s1|b=c|c=d" "$OUT/qa_s1.txt" | cut -c1-300; stamp "QA bench, s1"
[ "${QA_END:-400}" -lt 400 ] || timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py \
  --budgets 4096 16384 --kernels triton --paths bcd \
  --videos /tmp/wl/s2_h264_720p2997_g250_90s.mp4 /tmp/wl/m1_h264_720p30_g250_480s.mp4 \
  --json "$OUT/qa_s2m1.json" > "$OUT/qa_s2m1.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/qa_s2m1.txt" | cut -c1-300; stamp "QA bench, s2 and m1"
bundle_out
