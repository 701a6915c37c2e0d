#!/bin/bash
# 2026-12-04, second GPU call: the NVDEC GPU tests on carried clips (the machine has no ffmpeg), the decode mix with
# the capability check cached per (codec, pixel format) and one probe per file, the CLI on the whole set (with the
# compile failure's traceback if it comes back), and the first answer with the fork server started at the
# interpreter's start.   bash bench/device_call2.sh   (carry .whl: the wheels and .whl/nvdec_clips)
set -u
. bench/device_site.sh
echo "== GPU tests (NVDEC on carried clips)"
NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/datamodules/test_nvdec.py 2>&1 | tail -6
stamp "gpu tests"
python3 bench/workload.py --make /tmp/wl 2>&1 | tail -1; stamp "set made"
echo "== mix: the set x 3 in flight, 16 workers, then the CLI (decoder auto) on the whole set"
TORCHDYNAMO_VERBOSE=1 timeout 330 python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 16 --copies 3 \
  --cli --cli-decoders auto --json "$OUT/mix.json" > "$OUT/mix_full.txt" 2>&1
grep -v -E "^\s*(videomme|acc%|±95|robust|differences|scores:|report:)|WARN" "$OUT/mix_full.txt" > "$OUT/mix.txt"
grep -E "pool of|busy while|not decoded|^CLI|Video-MME|GPU step|needs|rror" "$OUT/mix.txt" | cut -c1-400 | head -30
grep -A25 "Traceback" "$OUT/mix_full.txt" | head -50
stamp "mix"
V=/tmp/fa_videos; python3 bench/cli_throughput.py --make-videos $V --n-videos 3 > $OUT/make.log 2>&1
cli_runs $V first second
