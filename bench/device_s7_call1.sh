#!/bin/bash
# Session 7, call 1 (2026-12-06; prepared in session 6 as bench/device_next.sh), on the tree that interleaves
# split videos with whole ones and starts the CPU decoders' workers from the fork server on CUDA. First the GPU tests
# (the graph capture beside a pinning thread, the NVDEC tests) while the set is made; then the user's CLI on 3 copies
# of the set (18 videos in flight): parts on (cold), on (warm), off (warm), records compared; bench/part_order_sim.py
# on the warm parts run. session 8's bench/device_s8_call1.sh ran the call after it (decoder=cpu against auto, whole set).
#   bash bench/device_s7_call1.sh          (carry .whl/nvdec_clips)
set -u
. bench/device_site.sh
export NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips
( timeout 170 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/test_gpu.py \
    tests/datamodules/test_nvdec.py > "$OUT/gpu_tests.txt" 2>&1 ) &
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
wait; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu_tests.txt" | head -12; stamp "gpu tests"
echo "== the CLI, 3 copies of the set: parts on (cold), on (warm), off (warm)"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 8 --cli --cli-copies 3 --cli-decoders auto auto auto/decode_part_mb=0 --json "$OUT/cli_copies.json" \
  > "$OUT/cli_copies.txt" 2>&1
echo "rc $?"; grep -E "^CLI|records identical|differs|Traceback|Error" "$OUT/cli_copies.txt" | cut -c1-1500 | head -20
python3 bench/part_order_sim.py "$OUT/cli_copies.json" 2>&1 | head -12
stamp "cli copies"
