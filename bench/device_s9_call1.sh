#!/bin/bash
# Session 9, call 1 (2026-12-06): (1) the user's CLI on the whole set with the defaults as they now are (the first
# video read on the CPU when it is under data.first_video_cpu_mpx): cold (fills the compile cache), off (mpx 0,
# warm), on again (warm); records compared; (2) import times of the CLI; (3) streaming extraction, window policy,
# re-prefills of 1 slide vs the runner's default K (never measured on a GPU).
#   bash bench/device_s9_call1.sh          (carry .whl)
set -u
. bench/device_site.sh
( python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; import cli_throughput as ct; \
ct.write_checkpoint(Path('/tmp/workload_cli/videollama3-7b-random'))" > "$OUT/ckpt.txt" 2>&1 ) &
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; wait
stamp "set made, checkpoint written"
timeout $(( 330 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 16 --cli --cli-decoders auto auto/first_video_cpu_mpx=0 auto --json "$OUT/cli.json" > "$OUT/cli.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|timeline|busy)|records identical|differing fields|Traceback|Error|first video" \
  "$OUT/cli.txt" | cut -c1-620 | head -24
stamp "CLI cold / off / on"
for i in 1 2; do python3 -X importtime -c "import cli" 2> /tmp/imp$i.txt; done
python3 - <<'PY'
import collections
for f in ("/tmp/imp1.txt", "/tmp/imp2.txt"):
    tot = collections.Counter()
    for line in open(f):
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        parts = line[len("import time:"):].split("|")
        tot[parts[2].strip().split(".")[0]] += int(parts[0])
    print(f, f"total {sum(tot.values()) / 1e6:.2f} s:", ", ".join(f"{k} {v / 1e6:.2f}" for k, v in tot.most_common(12)))
PY
stamp "imports"
timeout $(( 570 - ($(date +%s) - T0) )) python3 bench/extract_throughput.py --modes completed-block-hold \
  --sessions 16 --memory-policy window --reprefill-slides 1 auto --fuse-slide-rows --json "$OUT/extract.json" \
  > "$OUT/extract.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/extract.txt" | cut -c1-300
stamp "extraction"
