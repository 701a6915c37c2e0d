#!/bin/bash
# 2026-12-06 (session 5), first GPU call: (1) one long video's NVDEC latency when its sampled frames are cut at IDR
# periods over several decode PROCESSES (bench/nvdec_split_probe.py; session 4: 8 sessions in one process 16.4 s, 16
# sessions 29.3 s); (2) the ahead-of-time probe's per-kernel load errors (session 4: aot_load loaded 0 of 6, the reason
# cut). Logs go to $OUT and are grepped at each step (never piped through tail: a cut call loses them).
#   bash bench/device_s5_call1.sh
set -u
. bench/device_site.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
echo "== one long video over processes (PROCSxSESSIONS)"
timeout 240 python3 bench/nvdec_split_probe.py /tmp/wl/l1_h264_1080p2997_g250_1800s.mp4 \
  --configs 1x8 2x4 4x2 4x4 8x1 8x2 --json "$OUT/split.json" > "$OUT/split.txt" 2>&1
echo "rc $?"; grep -E "^split|sampled frames|Error|error" "$OUT/split.txt" | cut -c1-700 | head -20
stamp "split probe"
echo "== aot probe (7B-shaped kernels)"
timeout 220 python3 bench/aot_probe.py --config 7b --json "$OUT/aot.json" > "$OUT/aot.txt" 2>&1
echo "rc $?"; grep -iE "error|loaded|refus|kernel|total|variant|fill|warm|aot" "$OUT/aot.txt" | cut -c1-400 | head -60
stamp "aot"
