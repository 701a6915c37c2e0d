#!/bin/bash
# The last GPU call of the 2026-12-03 evening session: why the fused kernels' compilation failed in the CLI
# ("FileNotFoundError: '12'"), and the first answer cold / warm with the new start-up (issue 41).
set -u
source bench/device_site.sh   # T0, stamp, OUT; the wheels on PYTHONPATH
echo "HOME=${HOME-unset} TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR-unset} TRITON_CACHE_DIR=${TRITON_CACHE_DIR-unset}"
for opts in "--no-cli" "" "--thread --forkserver"; do
  TORCHDYNAMO_VERBOSE=1 timeout 120 python3 bench/compile_probe.py $opts 2>&1 | grep -v "^W1203" | tail -25
done
stamp "probes"
V=/tmp/fa_videos; python3 bench/cli_throughput.py --make-videos $V --n-videos 3 > $OUT/make.log 2>&1; stamp "videos"
run() {   # name, then env assignments / options
  local name=$1; shift
  echo "== $name"
  env "$@" timeout 150 python3 bench/cli_throughput.py --videos $V --n-videos 3 > "$OUT/$name.log" 2>&1
  grep -E "^(records|model load|first answer|steady step per video, mean)|^timeline|^warm-up|compile of .* failed" "$OUT/$name.log" | cut -c1-600
  stamp "$name"
}
C=$(mktemp -d)
run cold TORCHINDUCTOR_CACHE_DIR=$C
run warm TORCHINDUCTOR_CACHE_DIR=$C
run user_default_cache TORCHDYNAMO_VERBOSE=1
grep -B2 -A30 "Traceback" "$OUT/user_default_cache.log" | head -60
