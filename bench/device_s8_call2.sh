#!/bin/bash
# Session 8, call 2 (2026-12-06): (1) where today's QA step goes on this machine: bench/qa_step_profile.py with the
# background compilation as the CLI runs it (the first step's stages, steady steps on unseen videos, one under
# torch.profiler, the host's waits), and the step beside processes that decode as the CLI's workers do (16 and 8
# NVDEC, 16 CPU, none): call 1's short videos stepped in 1.68-1.90 s while NVDEC workers decoded, 1.25-1.32 s beside
# CPU decoders; (2) the first video read on the CPU (data.first_video_cpu_mb, new): the user's CLI on the whole set
# with the defaults, off (0; cold: it fills the compile cache), on (64), off again; records compared.
#   bash bench/device_s8_call2.sh          (no carry needed)
set -u
. bench/device_site.sh
V=/tmp/fa_videos
( python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; import cli_throughput as ct; \
ct.write_checkpoint(Path('/tmp/workload_cli/videollama3-7b-random'))" > "$OUT/ckpt.txt" 2>&1 ) &
( python3 bench/cli_throughput.py --make-videos $V --n-videos 3 > "$OUT/make_videos.log" 2>&1 ) &
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; wait; stamp "sets made, checkpoint written"
timeout 250 python3 bench/qa_step_profile.py --early-compile --videos $V/*.mp4 \
  --contention /tmp/wl/l1_h264_1080p2997_g250_1800s.mp4 > "$OUT/qa_step_profile.txt" 2>&1
echo "rc $?"; grep -E "^(warm-up|steady|## profiled|GPU busy|host stage|suffix|step |encode|compress|decode|prefill|kernel time|same video|seen video|host waits|steps beside)" \
  "$OUT/qa_step_profile.txt" | cut -c1-220 | head -40
stamp "profile"
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 16 --cli --cli-decoders auto/first_video_cpu_mb=0 auto auto/first_video_cpu_mb=0 \
  --json "$OUT/cli_first.json" > "$OUT/cli_first.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|timeline)|records identical|differing fields|Traceback|Error|first video" \
  "$OUT/cli_first.txt" | cut -c1-520 | head -30
stamp "first video on the CPU, off / on / off"
