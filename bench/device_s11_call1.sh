#!/bin/bash
# Session 11 (2026-12-06), call 1: the hand-written Triton kernels (models/triton_kernels.py, `kernels: triton`, new
# default) against eager and torch.compile (`kernels: inductor`, the default before) at the 7B sizes, then the user's
# CLI on the whole workload-shaped set: triton (Triton cache filled by the check), inductor cold, triton again,
# inductor warm, triton with data.worker_niceness=10; per run the first answer, the steps and the records compared.
# GPU tests first (beside the set's making), as in session 10.
#   bash bench/device_s11_call1.sh                        (carry .whl)
set -u
. bench/device_site.sh
gpu_tests_start            # (as run: the same commands, written inline; now device_site.sh's functions)
set_and_checkpoint
gpu_tests_report
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 bench/triton_kernels_check.py --json "$OUT/triton_check.json" > "$OUT/triton_check.txt" 2>&1
echo "rc $?"; cut -c1-220 "$OUT/triton_check.txt" | tail -12
stamp "triton check"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 16 --cli --cli-decoders auto auto/model.kernels=inductor auto auto/model.kernels=inductor \
  auto/worker_niceness=10 --json "$OUT/cli_kernels.json" > "$OUT/cli_kernels.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|stages)|records identical|differing fields|Traceback|Error" \
  "$OUT/cli_kernels.txt" | cut -c1-400 | head -24
stamp "CLI"
python3 - "$OUT/cli_kernels.json" <<'PY'
import json, sys
for name, r in json.load(open(sys.argv[1]))["cli_runs"].items():
    print(name, "first answer", r["first_answer_s"], "steps", [(v["video_id"][:3], round(v["step_s"], 2),
          "decoding" if any(w["decode_end"] > v["step_start"] for w in r["per_video"]) else "idle")
          for v in r["per_video"]])
PY
