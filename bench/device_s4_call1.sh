#!/bin/bash
# 2026-12-06 (session 4), first GPU call, measure before changing: the GPU tests left unconfirmed on 2026-12-04
# (the split-KV decode prefix, the damaged NVDEC clips), one long video's NVDEC latency per session count alone on
# the machine (engine, SM, CPU busy and the sessions' summed stage seconds), the user's CLI on the whole
# Video-MME-shaped set at full length with decoder=auto (GPU wait), and the ahead-of-time kernel probe.
#   bash bench/device_s4_call1.sh
set -u
. bench/device_site.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
echo "== GPU tests"
timeout 170 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/test_gpu.py \
  "tests/datamodules/test_nvdec.py::test_damaged_clips_on_nvdec" 2>&1 | grep -E "passed|failed|Error|^E |^FAILED" | head -20
stamp "gpu tests"
python3 bench/workload.py --make /tmp/wl 2>&1 | tail -1; stamp "set made"
echo "== one long video alone, per session count"
timeout 130 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only long --workers 1 --sweep \
  --sweep-counts 8 16 32 > "$OUT/sweep.txt" 2>&1
grep -E "^sweep|pool of" "$OUT/sweep.txt" | cut -c1-600
stamp "sweep"
echo "== the CLI on the whole set, decoder=auto (cold caches)"
timeout 200 python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 8 --cli \
  --cli-decoders auto --json "$OUT/cli_whole.json" > "$OUT/cli_whole.txt" 2>&1
echo "rc $?"; grep -E "^CLI|wait|simulated" "$OUT/cli_whole.txt" | cut -c1-900 | head -20
stamp "cli"
echo "== aot probe (7B-shaped kernels)"
timeout 150 python3 bench/aot_probe.py --config 7b --json "$OUT/aot.json" > "$OUT/aot.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/aot.txt" | cut -c1-300
stamp "aot"
