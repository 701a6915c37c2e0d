#!/bin/bash
# The decode feed on the lent H200 (issue 40): what the NVDEC pool's rate is bound by.
#   bash bench/device_decode.sh            (writes under $OUT when set)
# 1. the engines' capacity: many long videos in flight (--copies), packet-filtered and full decode, with the
#    per-stage seconds of every read (check, scan, demux, Decode, copy, convert) and the CPU / NVDEC / SM busy shares;
# 2. the Video-MME-shaped set at full length with 16 workers.
# The wheels come from .whl/site312.tar.xz (bench/make_device_site.sh builds it on the CPU machine).
set -u
T0=$(date +%s)
stamp() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
OUT=${OUT:-/tmp/device_out}; mkdir -p "$OUT"
if [ -f .whl/site312.tar.xz ] && [ ! -d /tmp/site/transformers ]; then
  mkdir -p /tmp/site && tar xJf .whl/site312.tar.xz -C /tmp/site && rm -rf /tmp/site/huggingface_hub* /tmp/site/tokenizers*
  python3 -m compileall -q -j 16 /tmp/site >/dev/null 2>&1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
stamp "site"
python3 bench/workload.py --make /tmp/wl 2>&1 | tail -2; stamp "set made"
WIN=${WIN:-600}
for path in ${PATHS:-nvdec nvdec_full}; do
  echo "== capacity: $path, 8 copies of the long video in flight (first ${WIN} s of each), 8 workers"
  timeout 300 python3 bench/workload.py --videos /tmp/wl --paths $path --workers 8 --only long --copies 8 \
    --window-s $WIN --json "$OUT/capacity_$path.json" 2>&1 | grep -E "pool of|busy while|stages|not decoded|Video-MME" | head -30
  stamp "capacity $path"
done
echo "== the set at full length, 16 workers"
timeout 300 python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 16 --json "$OUT/set16.json" 2>&1 \
  | grep -v -E "^\s*(videomme|acc%)" | tail -30
stamp "set"
