# Sourced by the device scripts (bench/device_decode.sh, bench/device_final.sh): the clock (T0, stamp), $OUT, and
# the wheels the GPU machine lacks unpacked once to /tmp/site from .whl/site312.tar.xz (bench/make_device_site.sh
# builds it on the CPU machine), on PYTHONPATH before the working tree.
T0=$(date +%s)
stamp() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
OUT=${OUT:-/tmp/device_out}; mkdir -p "$OUT"
if [ -f .whl/site312.tar.xz ] && [ ! -d /tmp/site/transformers ]; then
  mkdir -p /tmp/site && tar xJf .whl/site312.tar.xz -C /tmp/site && rm -rf /tmp/site/huggingface_hub* /tmp/site/tokenizers*
  python3 -m compileall -q -j 16 /tmp/site >/dev/null 2>&1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
