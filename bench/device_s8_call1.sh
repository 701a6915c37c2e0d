#!/bin/bash
# Session 8, call 1 (2026-12-06): the two figures issue 40 still lacks, on the tree session 7 left (4a78535).
# 1. the decode capacity with the CLI's worker count: the workload pool on NVDEC, 16 workers, 3 copies of the whole
#    set (18 videos in flight, every video whole: the CLI's choice where videos fill the workers), with the full
#    Video-MME simulated at session 7's steady CLI step (2.32 s, H100);
# 2. the records of decoder=auto against decoder=cpu (16 decoder threads) on the whole set with the defaults; the
#    records come back under $OUT/records, the runs' busy shares as plots.
#   bash bench/device_s8_call1.sh          (no carry needed)
set -u
. bench/device_site.sh
( python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; import cli_throughput as ct; \
ct.write_checkpoint(Path('/tmp/workload_cli/videollama3-7b-random'))" > "$OUT/ckpt.txt" 2>&1 ) &
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
timeout 170 python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 16 --copies 3 --part-mb 0 \
  --gpu-step-s '{"short": 2.32, "medium": 2.32, "long": 2.32}' --json "$OUT/pool.json" > "$OUT/pool.txt" 2>&1
echo "rc $? (pool)"; grep -E "full Video-MME|  same,|NVDEC busy|nvdec |steady" "$OUT/pool.txt" | cut -c1-300 | head -12
wait; stamp "pool; checkpoint written"
timeout $(( 575 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 16 --cli --cli-decoders auto cpu/decode_threads=16 --json "$OUT/cli_cpu_auto.json" \
  > "$OUT/cli_cpu_auto.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|busy)|records identical|differs|differing fields|Traceback|Error" \
  "$OUT/cli_cpu_auto.txt" | cut -c1-900 | head -16
python3 -c "import shutil, pathlib, os; o = pathlib.Path(os.environ['OUT'], 'records'); \
[(o / p.relative_to('/tmp/workload_cli')).parent.mkdir(parents=True, exist_ok=True) or shutil.copy(p, o / \
p.relative_to('/tmp/workload_cli')) for p in pathlib.Path('/tmp/workload_cli').glob('out_*/*/*/rank*.jsonl')]"
stamp "cpu vs auto"
for l in auto cpu/decode_threads=16; do timeout 20 python3 bench/plot_cli_run.py "$OUT/cli_cpu_auto.json" --label "$l" \
  -o "$OUT/cli_${l%%/*}.png" 2>&1 | tail -1; done
