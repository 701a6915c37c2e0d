#!/bin/bash
# Session 12, call 2 (as prepared in session 11 in device_next2.sh; H100): bench/qa_throughput.py at 4k and 16k on
# three videos of the workload-shaped set with the fused kernels as hand-written Triton kernels (kernels: triton, the
# default since session 11), then through torch.compile (--kernels inductor): (d) against its floor, and the token
# check between the paths (logits within --logit-tol, tokens where the top-2 margin exceeds it; b=c failed every row
# in session 10 with Inductor's kernels: logits 0.16-0.20 apart). Then the kernel check at the 7B sizes again. First,
# where the first answer's weight load goes now that no compilation shares its GIL (session 11: 7.7-7.9 s in the CLI,
# ~5 s alone in session 2): bench/load_probe.py, the raw safetensors read, the load alone, beside the (Triton) early
# warm-up thread, and that thread alone.
#   bash bench/device_next2.sh                            (carry .whl)
set -u
. bench/device_site.sh
set_and_checkpoint
timeout 120 python3 bench/load_probe.py --model-dir /tmp/workload_cli/videollama3-7b-random \
  --variants raw_safetensors device_map device_map_compile compile_alone > "$OUT/load_probe.txt" 2>&1
echo "rc $?"; tail -8 "$OUT/load_probe.txt" | cut -c1-300; stamp "load probe"
for k in triton inductor; do
  timeout $(( 560 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 --kernels $k \
    --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 /tmp/wl/s2_h264_720p2997_g250_90s.mp4 \
    /tmp/wl/m1_h264_720p30_g250_480s.mp4 --json "$OUT/qa_$k.json" > "$OUT/qa_$k.txt" 2>&1
  echo "rc $?"; tail -30 "$OUT/qa_$k.txt" | cut -c1-300
  stamp "QA bench, kernels $k"
done
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/triton_kernels_check.py --json "$OUT/triton_check.json" \
  > "$OUT/triton_check.txt" 2>&1; tail -7 "$OUT/triton_check.txt" | cut -c1-220; stamp "kernel check"
