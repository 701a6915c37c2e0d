#!/bin/bash
# 2026-12-04 (session 2), second GPU call: why the early compilation takes 12-14 s beside the load when the cache is
# warm (bench/load_probe.py contention variants + a cProfile of the compilation alone), the CLI's first answer with
# first_step=eager and with transformers' loader without its thread pool, and the decode pool's capacity on the mix
# with 6 copies in flight (the long video's latency bounded the 3-copy span).
#   bash bench/device_s2_call2.sh   (carry .whl)
set -u
. bench/device_site.sh
V=/tmp/fa_videos; python3 bench/cli_throughput.py --make-videos $V --n-videos 3 > $OUT/make.log 2>&1
stamp "videos made"
one() {  # name, extra CLI args...
  local name=$1; shift
  echo "== CLI, $name"
  timeout 110 python3 bench/cli_throughput.py --videos $V --n-videos 3 -- "$@" > "$OUT/fa_$name.log" 2>&1
  grep -E "^(records|model load|first answer|first-video wait|first video|steady step per video, mean)|^timeline|^warm-up" \
    "$OUT/fa_$name.log" | cut -c1-900
  stamp "$name"
}
one cold
echo "== load probe"
timeout 200 python3 bench/load_probe.py --model-dir /tmp/cli_throughput/videollama3-7b-random --variants compile_alone \
  compile_profile device_map_serial device_map_serial_compile compile_then_load device_map_compile_threads1 \
  > $OUT/load_probe.txt 2>&1
grep -E "cumtime|\{built-in|site-packages|models/" $OUT/load_probe.txt | head -40 | cut -c1-200
tail -8 $OUT/load_probe.txt; stamp "load probe"
one warm_eager --model.init_args.first_step=eager
HF_DEACTIVATE_ASYNC_LOAD=1 one warm_serial_load
python3 bench/workload.py --make /tmp/wl 2>&1 | tail -1; stamp "set made"
echo "== mix: the set x 6 in flight, 16 workers"
timeout 170 python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 16 --copies 6 --json "$OUT/mix6.json" \
  > "$OUT/mix6.txt" 2>&1
grep -E "pool of|busy while|not decoded|simulated|aggregate|needs" "$OUT/mix6.txt" | cut -c1-300 | head -12
stamp "mix"
