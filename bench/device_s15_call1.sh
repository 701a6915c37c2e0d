#!/bin/bash
# Session 15, call 1: does data.first_video_parts=3 bring the first answer forward (session 14: the first video's CPU
# read, 4.3 s beside the 15 workers' NVDEC starts, ends 1.6 s after the weights)? Files in $OUT (bundled out.tgz):
#   (1) the GPU tests;
#   (2) bench/worker_start_probe.py: a first NVDEC read's phases in 1, 4 and 15 forkserver workers released at
#       once (session 14: the engines idle 5 s after the workers' first jobs started), then 15 beside 8 GiB pinned;
#   (3) the user's CLI on the whole workload-shaped set, 16 workers, one Triton cache (cold in the first run), fresh
#       processes: the defaults (the weight reads now start beside the imports: models/early_weights.py), with
#       first_video_parts=3 (6 threads a part, the default), with data.cuda_turns (the workers' first CUDA calls in
#       the order of their first videos), both, then the defaults and parts=3 with the early reads off
#       (env.TOKENBUDGET_EARLY_WEIGHTS=0);
#       records of each run compared with the first's (bench/workload.py); one parts run sampled
#       (bench/start_sampler.py).
#   (4) with the time left, bench/qa_throughput.py --paths bcd at 4k and 16k (kernels: triton) on one video: does
#       b=c hold within --logit-tol now that (c)'s vision MLP rounds as the library's (session 12: 0.15-0.18 apart)?
#   bash bench/device_s15_call1.sh                        (carry .whl)
# As run (after ten refused starts, a lent H100 whose host was slower than session 14 call 2's: module built at
# 9.0-9.7 s against 7.4; 523 s): GPU tests 45 passed; the probe; CLI runs auto, first_video_parts=3, cuda_turns,
# early reads off (the fifth, parts=3 with turns, cut by CLI_END); the QA bench on s1. Files bench/results/s15call1_*.
set -u
. bench/device_site.sh
gpu_tests_start
set_and_checkpoint
gpu_tests_report
timeout 120 python3 bench/worker_start_probe.py --video /tmp/wl/s1_h264_360p25_g60_90s.mp4 --procs 1 4 15 \
  --json "$OUT/worker_start.json" > "$OUT/worker_start.txt" 2>&1; echo "rc $?"; cat "$OUT/worker_start.txt"
timeout 60 python3 bench/worker_start_probe.py --video /tmp/wl/s1_h264_360p25_g60_90s.mp4 --procs 15 --pinned-gb 8 \
  --json "$OUT/worker_start_pinned.json" > "$OUT/worker_start_pinned.txt" 2>&1; echo "rc $?"
cat "$OUT/worker_start_pinned.txt"; stamp "worker start probe"
export TRITON_CACHE_DIR=/tmp/triton_cli CLI_END=${CLI_END:-440}
workload_cli ab . auto auto/first_video_parts=3 auto/cuda_turns=true auto/env.TOKENBUDGET_EARLY_WEIGHTS=0 \
  auto/first_video_parts=3/cuda_turns=true auto/first_video_parts=3/env.TOKENBUDGET_EARLY_WEIGHTS=0
unset TRITON_CACHE_DIR
left=$(( 530 - ($(date +%s) - T0) ))
[ $left -gt 60 ] && { timeout $left python3 bench/qa_throughput.py --budgets 4096 16384 --kernels triton --paths bcd \
  --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 --json "$OUT/qa_s1.json" > "$OUT/qa_s1.txt" 2>&1
  echo "rc $?"; grep -E "^s1|b=c|c=d" "$OUT/qa_s1.txt" | cut -c1-300; stamp "QA bench, one video"; }
bundle_out
