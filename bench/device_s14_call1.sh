#!/bin/bash
# Session 14, call 1: where the first answer's 16 s go on the GPU machine, every thread at once, before any change
# (bench/start_sampler.py around the user's CLI), and what session 13 could not run, files in $OUT:
#   (1) the machine: cores, a one-core Python speed figure, `import torch` / `import cli` times (-X importtime);
#   (2) the user's CLI on the whole workload-shaped set, defaults, twice (a Triton cache of its own, empty at first),
#       each run sampled (start1.json, start2.json: every thread's stack every 10 ms for the first 30 s);
#   (3) the load probe: the pinned reader with 4, 8 and 16 threads against the raw read;
#   (4) the QA bench (paths b, c, d) at 4k and 16k on one video: b=c with the split of where b and c part.
#   bash bench/device_s14_call1.sh                        (carry .whl)
# As run (H100, 390 s): (1)-(3) as above; (4) ran out of GPU memory in its library-spread row (SDPA's MATH fallback
# at 16k; bench/qa_throughput.py mended since). Files bench/results/s14call1_*.
set -u
. bench/device_site.sh
nproc; lscpu | grep -E "Model name|MHz" | head -3
python3 -c "
import time; t=time.perf_counter(); s=0
for i in range(20_000_000): s+=i
print(f'one-core loop of 2e7 adds: {time.perf_counter()-t:.2f} s')"
stamp "machine"
set_and_checkpoint
import_times
for i in 1 2; do python3 -X importtime -c "import torch" 2> /tmp/impt$i.txt; tail -1 /tmp/impt$i.txt; done
stamp "imports"
export TRITON_CACHE_DIR=/tmp/triton_cli
timeout 200 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 16 --cli \
  --cli-decoders auto/env.BENCH_START_SAMPLE=start1.json auto/env.BENCH_START_SAMPLE=start2.json \
  --json "$OUT/cli.json" > "$OUT/cli.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|timeline|per video|stages)|records identical|Traceback|Error" "$OUT/cli.txt" \
  | sed 's/warm-up.*//' | cut -c1-700 | head -20
cp start1.json start2.json "$OUT/" 2>/dev/null
for i in 1 2; do
  t=$(python3 -c "import json; d=json.load(open('$OUT/cli.json')); r=list(d['cli_runs'].values())[$((i-1))]; print(r.get('out', ''))" 2>/dev/null)
  [ -n "$t" ] && cp "$t/timing_rank0.json" "$OUT/timing$i.json"
  python3 bench/start_sampler.py --summary "$OUT/start$i.json" --timing "$OUT/timing$i.json" --bins 0.5 \
    > "$OUT/start$i.txt" 2>&1
done
grep -A12 "## main thread" "$OUT/start2.txt" | cut -c1-160 | head -90
stamp "CLI"
unset TRITON_CACHE_DIR
timeout 90 python3 bench/load_probe.py --model-dir /tmp/workload_cli/videollama3-7b-random \
  --variants raw_safetensors pinned_threads_4 pinned_threads_8 pinned_threads_16 > "$OUT/load_probe.txt" 2>&1
echo "rc $?"; tail -6 "$OUT/load_probe.txt" | cut -c1-200; stamp "load probe"
left=$(( 570 - ($(date +%s) - T0) )); [ $left -lt 90 ] && { stamp "no time left for the QA bench"; exit 0; }
timeout $left python3 bench/qa_throughput.py --budgets 4096 16384 --kernels triton --paths bcd \
  --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 --json "$OUT/qa_s1.json" > "$OUT/qa_s1.txt" 2>&1
echo "rc $?"; grep -E "^s1|b=c|c=d|b vs c|bc_" "$OUT/qa_s1.txt" | cut -c1-300; stamp "QA bench, one video"
