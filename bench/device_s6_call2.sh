#!/bin/bash
# 2026-12-06 (session 6), second GPU call, after call 1 found (a) a CLI run ended by the pin-memory thread pinning
# while the step captured a decode graph (capture error mode now thread_local) and (b) the parts run's workers started
# 17.8 s late (Lightning's iterability check started and dropped a first set of workers; the join now hands that
# unread iterator to the loop). The GPU test of (a) during the set's making; then the user's CLI on the whole set:
# parts on (cold), on (warm), off (warm), decoder=cpu (8 threads per worker), records of each against the first.
#   bash bench/device_s6_call2.sh
set -u
. bench/device_site.sh
( timeout 150 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/test_gpu.py \
    -k "pins_host_memory or graph_decode_equals or one_question_after" > "$OUT/gpu_tests.txt" 2>&1 ) &
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
wait; grep -E "passed|failed|^FAILED|^ERROR|Error" "$OUT/gpu_tests.txt" | head -12; stamp "gpu tests"
echo "== the CLI on the whole set: parts on (cold), on (warm), off (warm), cpu"
timeout $(( 590 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 8 --cli --cli-decoders auto auto auto/decode_part_mb=0 cpu/decode_threads=8 \
  --json "$OUT/cli.json" > "$OUT/cli.txt" 2>&1
echo "rc $?"; grep -E "^CLI|records identical|differs|Traceback|Error" "$OUT/cli.txt" | cut -c1-1500 | head -40
stamp "cli"
