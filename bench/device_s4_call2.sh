#!/bin/bash
# 2026-12-06 (session 4), second GPU call (the only one left: failed starts took the rest of the device time):
# the NVDEC GPU tests (the new per-session streams and demuxer seek against decord) and the split-KV decode test,
# one long video's NVDEC latency per variant (call 1: 8 sessions 18.3 s, 16 sessions 29.3 s, the engines 45 % /
# 29 % busy), the demuxer's seek, then the user's CLI on the whole set with the fastest exact variant.
#   bash bench/device_s4_call2.sh   (ran at 13e7f58: the 's' / 'k' sweep variants and the TOKENBUDGET_NVDEC_* switches
#   were removed after it, neither was faster)
set -u
. bench/device_site.sh
export NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
echo "== GPU tests: NVDEC + the split-KV prefix part"
timeout 120 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/datamodules/test_nvdec.py \
  "tests/test_gpu.py::test_bounded_prefix_part_equals_the_flash_prefix_part_on_cuda" > "$OUT/gpu_tests.txt" 2>&1
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu_tests.txt" | head -20
stamp "gpu tests"
echo "== one long video alone: sessions x own streams (s) x demuxer seek (k)"
timeout 130 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 1 --sweep \
  --sweep-counts 8 8s 8k 8sk 16sk > "$OUT/sweep.txt" 2>&1
grep -E "^sweep" "$OUT/sweep.txt" | cut -c1-760
stamp "sweep"
echo "== demuxer seek"
timeout 30 python3 bench/demux_seek_probe.py /tmp/wl/l1_h264_1080p2997_g250_1800s.mp4 0 61 900 > "$OUT/seek.txt" 2>&1
grep -v "Seek accuracy" "$OUT/seek.txt" | cut -c1-400 | head -12
stamp "seek"
# the fastest 8-session variant whose frames equal the plain one's, for the CLI's workers
best=$(python3 - "$OUT/sweep.txt" <<'PY'
import re, sys
rows = [(float(m.group(2)), m.group(1)) for line in open(sys.argv[1])
        for m in [re.search(r"^sweep \S+: (8s?k?) sessions .*?, ([0-9.]+) s\); .*frames equal", line)] if m]
print(min(rows)[1] if rows else "8")
PY
)
export TOKENBUDGET_NVDEC_SESSION_STREAMS=$([[ $best == *s* ]] && echo 1 || echo 0)
export TOKENBUDGET_NVDEC_DEMUX_SEEK=$([[ $best == *k* ]] && echo 1 || echo 0)
echo "== the CLI on the whole set, decoder=auto, variant $best (streams $TOKENBUDGET_NVDEC_SESSION_STREAMS, seek $TOKENBUDGET_NVDEC_DEMUX_SEEK)"
timeout 170 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 8 --cli \
  --cli-decoders auto --json "$OUT/cli_whole.json" > "$OUT/cli_whole.txt" 2>&1
echo "rc $?"; grep -E "^CLI|simulated" "$OUT/cli_whole.txt" | cut -c1-900 | head -12
stamp "cli"
