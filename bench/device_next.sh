#!/bin/bash
# Prepared in session 10 (2026-12-06) for the next session's first call: does lowering the decode workers' CPU
# priority (data.worker_niceness, new, default 0) keep the steps that run beside the long file's decode near the
# uncontended step? Session 10 call 1 (H100): the same videos' steps took 40-60 % longer while the 30-minute 1080p
# file was still decoding (CPUs 80-95 % busy, SMs below 100 %) than in a run where decoding had ended. The user's
# CLI on the whole set, 16 workers: defaults cold (fills the compile cache), then warm: data.worker_niceness=10,
# data.pin_memory=false (the main process's pin-memory thread pins each video's frames beside the step: page-locking
# takes the driver's locks the step's launches need), the defaults, niceness again; per run the per-video steps by
# whether a worker was still decoding, the first answer, and the records compared.
#   bash bench/device_next.sh                             (carry .whl)
set -u
. bench/device_site.sh
set_and_checkpoint
cli() {   # cli <name> <variants...>: the whole set through the user's CLI, 16 workers
  local name=$1; shift
  timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
    --workers 16 --cli --cli-decoders "$@" --json "$OUT/cli_$name.json" > "$OUT/cli_$name.txt" 2>&1
  echo "rc $?"; grep -E "^CLI.*(videos,|stages)|records identical|differing fields|Traceback|Error" \
    "$OUT/cli_$name.txt" | cut -c1-400 | head -14
  stamp "CLI $name"
}
cli niceness auto auto/worker_niceness=10 auto/pin_memory=false auto auto/worker_niceness=10
python3 - "$OUT/cli_niceness.json" <<'PY'
import json, sys
for name, r in json.load(open(sys.argv[1]))["cli_runs"].items():
    print(name, "first answer", r["first_answer_s"], "steps", [(v["video_id"][:3], round(v["step_s"], 2),
          "decoding" if any(w["decode_end"] > v["step_start"] for w in r["per_video"]) else "idle")
          for v in r["per_video"]])
PY
