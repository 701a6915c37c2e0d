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

# the user's CLI (bench/cli_throughput.py, defaults) on the first 3 videos of folder $1, once per name given after it
# (the first run finds the compile cache cold, later ones warm): $OUT/fa_<name>.log and its summary lines
cli_runs() {
  local v=$1; shift
  for name in "$@"; do
    echo "== CLI, $name"
    timeout 120 python3 bench/cli_throughput.py --videos "$v" --n-videos 3 > "$OUT/fa_$name.log" 2>&1
    grep -E "^(records|first answer|first-video wait|steady step per video, mean|wait share)|^timeline|^warm-up|^\[rank|compile of" \
      "$OUT/fa_$name.log" | cut -c1-700
    stamp "$name"
  done
}
