#!/bin/bash
# 2026-12-04 (session 2), first GPU call: profile before changing the start (issue 41): where the weight load's
# seconds go (bench/load_probe.py: CPU-then-.to vs from_pretrained(device_map) with accelerate, each alone and beside
# the early compilation), the user's CLI first answer with accelerate (cold, warm, warm + first_step=eager) and
# without it (warm), and one steady QA step under the profiler (bench/qa_step_profile.py).
#   bash bench/device_s2_call1.sh   (carry .whl)
set -u
. bench/device_site.sh
python3 -c "import accelerate, sys; print('accelerate', accelerate.__version__, accelerate.__file__)"
nproc; free -g | head -2
V=/tmp/fa_videos; python3 bench/cli_throughput.py --make-videos $V --n-videos 3 > $OUT/make.log 2>&1
stamp "videos made"
one() {  # name, extra CLI args...
  local name=$1; shift
  echo "== CLI, $name"
  timeout 110 python3 bench/cli_throughput.py --videos $V --n-videos 3 "$@" > "$OUT/fa_$name.log" 2>&1
  grep -E "^(records|model load|first answer|first-video wait|first video|steady step per video, mean)|^timeline|^warm-up" \
    "$OUT/fa_$name.log" | cut -c1-900
  stamp "$name"
}
one cold_accel
echo "== load probe"
timeout 150 python3 bench/load_probe.py --model-dir /tmp/cli_throughput/videollama3-7b-random > $OUT/load_probe.txt 2>&1
tail -8 $OUT/load_probe.txt; stamp "load probe"
one warm_accel
one warm_accel_eager --model.init_args.first_step=eager
mkdir -p /tmp/off && mv /tmp/site/accelerate /tmp/off/ 2>/dev/null
one warm_noaccel
mv /tmp/off/accelerate /tmp/site/ 2>/dev/null
echo "== qa step profile"
timeout 170 python3 bench/qa_step_profile.py --videos /tmp/fa_videos/*.mp4 > $OUT/qa_step_profile.txt 2>&1
echo "rc $?"; grep -vE "^\s*$" $OUT/qa_step_profile.txt | tail -60 | cut -c1-220
stamp "profile"
