#!/bin/bash
# Session 11, call 2 (prepared in session 10 as bench/device_next2.sh, run as it was): where the contended step's time goes.
# bench/qa_step_profile.py --loader-contention (new): the same seen videos stepped beside the CLI's own decode loader
# (16 workers over the workload-shaped set, encoder sizes held in the workers, the CLI's decoder threads): none,
# auto, auto with worker_niceness 10, auto unpinned, cpu, none again. A step as slow beside cpu workers as beside
# auto ones is CPU starvation of this process; slower beside auto only, the GPU's other contexts (NVDEC sessions,
# their copies). Session 10's CLI runs: the same 480 s video 3.65-3.97 s beside the long file's decode, 2.50 s after.
#   bash bench/device_next2.sh                            (carry .whl)
set -u
. bench/device_site.sh
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/qa_step_profile.py --no-cprofile --contention-only \
  --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 /tmp/wl/s2_h264_720p2997_g250_90s.mp4 \
  /tmp/wl/m1_h264_720p30_g250_480s.mp4 /tmp/wl/s3_vp9_360p30_90s.webm \
  --loader-contention /tmp/wl/*.mp4 /tmp/wl/*.webm --loader-workers 16 > "$OUT/loader_contention.txt" 2>&1
echo "rc $?"; grep -E "^steps beside|warm-up|model built|Traceback|Error" "$OUT/loader_contention.txt" | cut -c1-400
stamp "loader contention"
