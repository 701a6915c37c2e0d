#!/bin/bash
# 2026-12-06 (session 4), second GPU call: the GPU tests (written to $OUT, call 1 lost their lines), one long video's
# NVDEC latency with each session on a CUDA stream of its own (call 1: 8 sessions 18.3 s, 16 sessions 29.3 s, the
# engines 45 % / 29 % busy), the demuxer's seek, and the ahead-of-time probe's errors.
#   bash bench/device_s4_call2.sh
set -u
. bench/device_site.sh
export NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
echo "== one long video alone: sessions x own streams"
timeout 140 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 1 --sweep \
  --sweep-counts 8 8s 8k 8sk 16sk > "$OUT/sweep.txt" 2>&1
grep -E "^sweep" "$OUT/sweep.txt" | cut -c1-700
stamp "sweep"
echo "== demuxer seek"
timeout 40 python3 bench/demux_seek_probe.py /tmp/wl/l1_h264_1080p2997_g250_1800s.mp4 0 61 900 > "$OUT/seek.txt" 2>&1
grep -v "Seek accuracy" "$OUT/seek.txt" | cut -c1-400 | head -12
stamp "seek"
echo "== GPU tests"
timeout 200 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/datamodules/test_nvdec.py tests/test_gpu.py \
  > "$OUT/gpu_tests.txt" 2>&1
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu_tests.txt" | head -20
stamp "gpu tests"
echo "== aot probe: save + load only (call 1 loaded nothing: why)"
timeout 70 python3 bench/aot_probe.py --config 7b --variants aot_save,aot_load --repeats 1 --no-compare-compiled \
  --json "$OUT/aot.json" > "$OUT/aot.txt" 2>&1
echo "rc $?"; grep -v "^\s*$" "$OUT/aot.txt" | tail -25 | cut -c1-400
stamp "aot"
