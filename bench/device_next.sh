#!/bin/bash
# Session 14: the CLI runs now start with data.first_video_parts=3 (2 and 6 threads a part) against the defaults
# (session 14 call 2 cut that run; the first video's CPU read ends 1.6 s after the weights) and compare the records.
# Session 13: its call ran the GPU tests (43 passed) and the CLI defaults against the pinned reader and 6 first-video
# threads (now the defaults); still to run: the kernels: eager records, the early CUDA context's A/B
# (env.TOKENBUDGET_EARLY_CUDA=0, added to the CLI runs) and the first-step profile.
# Prepared in session 12 for the next session (session 12's call 3 ran only its short form, bench/device_s12_call3.sh):
# the GPU tests (two changed in session 12 and not yet run on a GPU: the vision MLP bit for bit under kernels:
# triton, its one epilogue GEMM under inductor), then the user's CLI on the whole workload-shaped set with a Triton
# cache of its own that starts empty: the defaults (cold), kernels: eager (the records against triton's: session 12
# call 1 found 8 of 36 identical while the GELU epilogue still ran in both; now both run the library's GELU), the
# defaults (warm); then the first step after the CLI's whole early warm-up under cProfile
# (bench/qa_step_profile.py --early-compile: what the first step still pays that a second does not).
#   bash bench/device_next.sh                             (carry .whl)
#   DEADLINE=240 CLI_END=240 CLI_RUNS="auto auto/model.kernels=eager" bash bench/device_next.sh     (a short call)
set -u
DEADLINE=${DEADLINE:-440}; CLI_END=${CLI_END:-$(( DEADLINE - 110 ))}   # seconds after the start
CLI_RUNS=${CLI_RUNS:-auto auto/first_video_parts=3/first_video_threads=2 auto auto/first_video_parts=3 auto/model.kernels=eager auto/env.TOKENBUDGET_EARLY_CUDA=0}
. bench/device_site.sh
gpu_tests_start
set_and_checkpoint
gpu_tests_report
export TRITON_CACHE_DIR=/tmp/triton_cli
timeout $(( CLI_END - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 16 --cli --cli-decoders $CLI_RUNS \
  --json "$OUT/cli_defaults.json" > "$OUT/cli_defaults.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|stages|timeline)|records identical|differing fields|Traceback|Error" \
  "$OUT/cli_defaults.txt" | cut -c1-600 | head -30
stamp "CLI"
unset TRITON_CACHE_DIR
left=$(( DEADLINE - ($(date +%s) - T0) )); [ $left -lt 60 ] && { stamp "no time left for the profile"; bundle_out; exit 0; }
timeout $left python3 bench/qa_step_profile.py --early-compile --contention-only \
  --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 /tmp/wl/s2_h264_720p2997_g250_90s.mp4 > "$OUT/first_step.txt" 2>&1
echo "rc $?"; grep -E "^model built|decoded in|^early compilation|^first-call|^## warm-up|stages \(s\)|^warm-up video again" \
  "$OUT/first_step.txt" | cut -c1-400
stamp "first step profile"
bundle_out
