#!/bin/bash
# Session 14, call 2: this session's first-answer changes against session 13's code on the same machine, files in $OUT:
#   (1) the GPU tests (the pinned load now reads ahead of transformers' imports);
#   (2) the user's CLI on the whole workload-shaped set, 16 workers, one Triton cache (cold in the first run,
#       old1): session 13's code (1ad9a05, carried as .old: `git archive 1ad9a05 -- <code> | tar -x -C .old`) and
#       this session's, alternated: lazy video processor, ParquetFile annotations, weight reads ahead of the imports
#       ("new"; then with data.first_video_parts=3, 2 threads a part); every new run sampled
#       (bench/start_sampler.py); records compared with the second session-13 run.
#   bash bench/device_s14_call2.sh                        (carry .whl and .old)
# As run (kind nvidia-h200 asked after eleven refused starts, an H100 came; 337 s): GPU tests 43 passed; old1, new1,
# old2 ran; new2 (first_video_parts=3) answered its first video and was cut by CLI_END; the table below found no
# file (it read /tmp/device_out, not the tool's $OUT; mended since). Files bench/results/s14call2_*.
set -u
. bench/device_site.sh
gpu_tests_start
set_and_checkpoint
gpu_tests_report
export TRITON_CACHE_DIR=/tmp/triton_cli CLI_END=${CLI_END:-330}
workload_cli old1 .old auto
workload_cli new1 . auto/env.BENCH_START_SAMPLE=new1.json
workload_cli old2 .old auto
workload_cli new2 . auto/first_video_parts=3/first_video_threads=2/env.BENCH_START_SAMPLE=p3t2.json
cp new1.json p3t2.json "$OUT/" 2>/dev/null
OUT="$OUT" python3 - <<'PY'
import json, os, sys
sys.path.insert(0, "bench")
from pathlib import Path
import workload as w
out = Path(os.environ["OUT"])   # (the device tool's $OUT where it sets one: as run, this read /tmp/device_out)
runs = {}
for label in ("old1", "new1", "old2", "new2"):
    f = out / f"cli_{label}.json"
    if f.is_file():
        for k, v in json.loads(f.read_text())["cli_runs"].items():
            runs[f"{label}:{k.split('/env.')[0]}"] = v
ref = runs.get("old2:auto")
print("run                                   first answer  module_built  loader_built  first_decode  load_end  decode_end  step1")
for k, v in runs.items():
    t = v["timeline_s"]
    print(f"{k:38s} {t['first_answer']:11.1f} {t.get('module_built', 0):13.1f} {t.get('loader_built', 0):13.1f} "
          f"{t.get('first_decode_start', 0):13.1f} {t.get('load_end', 0):9.1f} {t.get('first_decode_end', 0):11.1f} "
          f"{v['step_s'][0]:6.2f}")
    if ref is not None and k != "old2:auto":
        same, total = w.compare_records(Path(ref["out"]), Path(v["out"]))
        print(f"   records identical to old2: {same} of {total}")
PY
stamp "table"
