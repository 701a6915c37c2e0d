#!/bin/bash
# 2026-12-06 (session 6), first GPU call: the tree as session 5 left it (the join's loader iterator created eagerly,
# not yet measured on the GPU). The user's CLI on the whole set (6 videos, full length, 8 workers): parts on (cold
# cache), on (warm), off (warm); then decoder=cpu on the whole set (8 threads per worker) and its records against the
# first auto run's; then, if the time allows, a cold run with first_step=eager (its own fresh Inductor cache).
#   bash bench/device_s6_call1.sh
set -u
. bench/device_site.sh
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
echo "== the CLI on the whole set: parts on (cold), on (warm), off (warm)"
timeout 230 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 8 --cli \
  --cli-decoders auto auto auto/decode_part_mb=0 --json "$OUT/cli_parts.json" > "$OUT/cli_parts.txt" 2>&1
echo "rc $?"; grep -E "^CLI|records identical|Traceback|Error" "$OUT/cli_parts.txt" | cut -c1-1500 | head -24
stamp "cli parts"
echo "== the CLI on the whole set, decoder=cpu (decode_threads 8), records against the first auto run"
timeout 270 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 8 --cli \
  --cli-decoders cpu/decode_threads=8 --json "$OUT/cli_cpu.json" > "$OUT/cli_cpu.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*videos|Traceback|Error" "$OUT/cli_cpu.txt" | cut -c1-800 | head -8
python3 - <<'PY'
import importlib.util, glob, os
spec = importlib.util.spec_from_file_location("workload", "bench/workload.py"); w = importlib.util.module_from_spec(spec)
spec.loader.exec_module(w)
from pathlib import Path
auto = sorted(glob.glob("/tmp/workload_cli/out_auto_*")); cpu = sorted(glob.glob("/tmp/workload_cli/out_cpu_*"))
if auto and cpu:
    same, total = w.compare_records(Path(auto[0]), Path(cpu[-1]))
    print(f"records identical decoder=auto (first run) vs decoder=cpu: {same} of {total}")
else:
    print("records: missing", auto, cpu)
PY
stamp "cpu"
if [ $(( $(date +%s) - T0 )) -lt 470 ]; then
  echo "== cold cache, first_step=eager"
  TOKENBUDGET_INDUCTOR_CACHE=/tmp/cold_eager timeout $(( 580 - ($(date +%s) - T0) )) python3 bench/workload.py \
    --videos /tmp/wl --paths nvdec --only short --workers 8 --cli --cli-decoders auto/model.first_step=eager \
    --json "$OUT/cli_eager.json" > "$OUT/cli_eager.txt" 2>&1
  echo "rc $?"; grep -E "^CLI|Traceback|Error" "$OUT/cli_eager.txt" | cut -c1-1200 | head -6
  stamp "eager cold"
fi
