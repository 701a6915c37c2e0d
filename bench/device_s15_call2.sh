#!/bin/bash
# Session 15, call 2: the two issue-41 figures not re-measured since sessions 10 and 12, files in $OUT (out.tgz):
#   (1) bench/qa_throughput.py --paths bcd at 4k and 16k, kernels: triton, on three videos of the workload-shaped
#       set: (d) against its floor, and the token check (logits within --logit-tol, tokens where the top-2 margin
#       exceeds it): does b=c hold now that (c)'s vision MLP rounds as the library's (session 12: 0.16-0.20 apart);
#   (2) bench/extract_throughput.py, 16 sessions, completed-block-hold: `window` (K=auto) and `sliding`, share of
#       the compute ceiling (session 10: window 61 %; sliding 58 % on the H200 of 2026-12-02).
#   bash bench/device_s15_call2.sh                        (carry .whl)
set -u
. bench/device_site.sh
set_and_checkpoint
timeout $(( 330 - ($(date +%s) - T0) )) python3 bench/qa_throughput.py --budgets 4096 16384 --kernels triton \
  --paths bcd --videos /tmp/wl/s1_h264_360p25_g60_90s.mp4 /tmp/wl/s2_h264_720p2997_g250_90s.mp4 \
  /tmp/wl/m1_h264_720p30_g250_480s.mp4 --json "$OUT/qa_triton.json" > "$OUT/qa_triton.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/qa_triton.txt" | cut -c1-300; stamp "QA bench"
timeout $(( 470 - ($(date +%s) - T0) )) python3 bench/extract_throughput.py --modes completed-block-hold \
  --sessions 16 --memory-policy window sliding --reprefill-slides auto --json "$OUT/extract.json" \
  > "$OUT/extract.txt" 2>&1
echo "rc $?"; tail -30 "$OUT/extract.txt" | cut -c1-300; stamp "extraction"
bundle_out
