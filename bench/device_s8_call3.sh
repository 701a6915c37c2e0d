#!/bin/bash
# Session 8, call 3 (2026-12-06): the GPU tests (beside the set making, untimed); the engines' capacity over a longer
# window with every worker busy (the workload pool on NVDEC, 16 workers, 6 copies of the whole set: 36 videos, whole,
# the full Video-MME simulated at call 1's steady CLI step, 2.15 s); the user's CLI with the defaults (the first video
# read on the CPU) on the whole set, cold then warm.
#   bash bench/device_s8_call3.sh          (carry .whl/nvdec_clips)
set -u
. bench/device_site.sh
export NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips
( python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; import cli_throughput as ct; \
ct.write_checkpoint(Path('/tmp/workload_cli/videollama3-7b-random'))" > "$OUT/ckpt.txt" 2>&1 ) &
( timeout 150 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/test_gpu.py \
    tests/datamodules/test_nvdec.py > "$OUT/gpu_tests.txt" 2>&1 ) &
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; wait
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu_tests.txt" | head -12; stamp "set made, checkpoint written, gpu tests"
timeout 140 python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 16 --copies 6 --part-mb 0 \
  --gpu-step-s '{"short": 2.15, "medium": 2.15, "long": 2.15}' --json "$OUT/pool6.json" > "$OUT/pool6.txt" 2>&1
echo "rc $? (pool, 6 copies)"; grep -E "full Video-MME|  same,|busy while|M source frames" "$OUT/pool6.txt" | cut -c1-300
stamp "pool"
timeout $(( 385 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 16 --cli --cli-decoders auto auto --json "$OUT/cli_defaults.json" > "$OUT/cli_defaults.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|timeline|busy)|records identical|Traceback|Error|first video" \
  "$OUT/cli_defaults.txt" | cut -c1-520 | head -12
stamp "CLI defaults, cold and warm"
