#!/bin/bash
# Session 17, call 4 (its first try passed the sampler's file as a path: a variant takes no "/"; run again):
# (1) bench/mps_probe.py --cases quit: does the control program's quit wait for a living
# client (call 3's MPS runs took 14-17 s longer to exit than without)? models.mps.stop_mps no longer waits for it.
# (2) one CLI run, defaults (MPS), whole workload-shaped set, under bench/start_sampler.py to 90 s: where the
# ~11 s between predict_end and the scores go (call 3: one core busy, the GPU idle), and the process's exit.
#   bash bench/device_s17_call4.sh                        (carry .whl)
set -u
. bench/device_site.sh
python3 bench/mps_probe.py --cases quit --long-s 8 2>&1 | tee "$OUT/mps_quit.txt"
stamp "mps quit probe"
set_and_checkpoint
export TRITON_CACHE_DIR=/tmp/triton_cli BENCH_START_SAMPLE_UNTIL=90
CLI_END=200 workload_cli tail . auto/env.BENCH_START_SAMPLE=tail_samples.json   # (no "/" in a variant: a file here)
mv tail_samples.json "$OUT/"
grep -o '"process_s": [0-9.]*' "$OUT/cli_tail.json" | head -2
T=$(ls -d /tmp/workload_cli/out_auto* | tail -1)/timing_rank0.json
python3 bench/start_sampler.py --summary "$OUT/tail_samples.json" --timing "$T" --bins 1.0 > "$OUT/tail_summary.txt" 2>&1
cp "$T" "$OUT/"
python3 - "$OUT/tail_summary.txt" "$T" <<'PY'
import json, re, sys
pe = json.load(open(sys.argv[2]))["timeline_s"]["predict_end"]
print("predict_end", pe)
block = None
for line in open(sys.argv[1]):
    if line.startswith("## thread"):
        block = line.strip(); print(block[:200])
        continue
    m = re.match(r"\s+([0-9.]+) s\s", line)
    if m and float(m.group(1)) >= pe - 1 and block and "MainThread" in block:
        print(line.rstrip()[:400])
PY
rm -f "$OUT/tail_samples.json.big"
bundle_out
