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

# the 7B-size random checkpoint of the CLI runs (/tmp/workload_cli/videollama3-7b-random, in the background) and the
# workload-shaped set (/tmp/wl), both made here; returns when both are written
set_and_checkpoint() {
  # a warm machine keeps /tmp between calls: a checkpoint whose last file (the qbase weights) is there is whole
  [ -f /tmp/workload_cli/videollama3-7b-random/qbase/model.safetensors ] && [ -d /tmp/wl ] && {
    stamp "set and checkpoint already here (warm machine)"; return; }
  ( python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; import cli_throughput as ct; \
ct.write_checkpoint(Path('/tmp/workload_cli/videollama3-7b-random'))" > "$OUT/ckpt.txt" 2>&1 ) &
  local ckpt=$!
  python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; wait "$ckpt"   # (not a bare wait: GPU tests may run)
  stamp "set made, checkpoint written"
}

# `python -X importtime -c "import cli"`, twice: the total and the top-level packages that take most of it
import_times() {
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
}

# the GPU tests (tests/test_gpu.py, tests/datamodules/test_nvdec.py -m gpu, the NVDEC clips carried in .whl) in the
# background: gpu_tests_start, then gpu_tests_report (waits, prints the summary lines of $OUT/gpu_tests.txt)
gpu_tests_start() {
  export NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips
  ( timeout 200 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/test_gpu.py \
      tests/datamodules/test_nvdec.py > "$OUT/gpu_tests.txt" 2>&1 ) &
  GPU_TESTS_PID=$!
}
gpu_tests_report() {
  wait "$GPU_TESTS_PID"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu_tests.txt" | head -12; stamp "gpu tests"
}

# everything in $OUT as one archive, $OUT/out.tgz (the device tool returns only a few files a call: session 14's call 2
# lost its sampler files and GPU test log to that count); call it last
bundle_out() {
  tar czf /tmp/out.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/out.tgz "$OUT/" && stamp "bundled: $OUT/out.tgz"
}

# the user's CLI on the workload-shaped set (/tmp/wl, 16 workers) by the bench/workload.py under folder $2 (`.`, or an
# older checkout carried in), one run per --cli-decoders entry after it, until CLI_END s after the start (default
# 400): $OUT/cli_$1.json / .txt, and their summary lines here
workload_cli() {
  local label=$1 dir=$2; shift 2
  local left=$(( ${CLI_END:-400} - ($(date +%s) - T0) ))
  local args=(--videos /tmp/wl --paths nvdec --only short --workers 16 --cli --json "$OUT/cli_$label.json")
  timeout "$left" python3 "$dir/bench/workload.py" "${args[@]}" --cli-decoders "$@" > "$OUT/cli_$label.txt" 2>&1
  echo "rc $? ($label)"
  grep -E "^CLI.*(videos,|timeline|per video|stages)|records identical|Traceback|Error" "$OUT/cli_$label.txt" \
    | sed 's/; warm-up.*//' | cut -c1-600 | head -24
  stamp "CLI $label"
}

# the step profiles (callbacks.step_profile, BENCH_STEP_PROFILE) of every CLI run in workload json $1: each profiled
# step in the run and alone, and their ratios (at most $2 characters of them, default 600); $OUT/prof_summary.txt
step_profile_summary() {
  python3 - "$1" "${2:-600}" <<'PY' 2>&1 | tee "$OUT/prof_summary.txt"
import json, sys
for name, run in json.load(open(sys.argv[1]))["cli_runs"].items():
    for s in run.get("step_profile") or []:
        for k in ("run", "alone"):
            r = s.get(k) or {}
            print(name, s["step"], s.get("video_id"), k, {x: r.get(x) for x in ("wall_s", "busy_ms", "kernel_ms",
                  "gap_ms", "host_cpu_s", "host_runqueue_s", "by_class_ms")})
        print("   ratio", json.dumps(s.get("ratio"))[:int(sys.argv[2])])
PY
}
