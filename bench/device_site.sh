# Sourced by the bench/device_*.sh scripts on the lent GPU machine (no network there): the wheels it lacks come
# from .whl/site312.tar.xz (bench/make_device_site.sh builds it on the CPU machine; name `.whl` in `carry`), unpacked
# once to /tmp/site and byte-compiled as pip does at install, so that no timing includes bytecode compiling.
# Defines T0 and stamp ("[t+Ns] what"), OUT (default /tmp/device_out), PYTHONPATH and PYTHONUNBUFFERED.
T0=$(date +%s)
stamp() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
OUT=${OUT:-/tmp/device_out}; mkdir -p "$OUT"
if [ -f .whl/site312.tar.xz ] && [ ! -d /tmp/site/transformers ]; then
  mkdir -p /tmp/site && tar xJf .whl/site312.tar.xz -C /tmp/site && rm -rf /tmp/site/huggingface_hub* /tmp/site/tokenizers*
  python3 -m compileall -q -j 16 /tmp/site >/dev/null 2>&1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
