#!/bin/bash
# Issue 41: the first answer after process start, cold and warm caches: the default hand-written Triton kernels
# (kernels: triton), then torch.compile (kernels: inductor) waiting for the early compilation or stepping eagerly
# meanwhile, in one device call (the user's CLI, bench/cli_throughput.py, 7B-size random
# checkpoint, videomme.yaml). On the lent H200, after bench/device_session.sh's site set-up (or with the wheels):
#   bash bench/first_answer.sh [VIDEOS_DIR]        (N_VIDEOS=3 by default; OUT= where the logs go)
# Each run is a fresh process; "cold" is an empty TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR, "warm" the same
# directory again. The weights are in the page cache in every run (the checkpoint is written by the first one).
set -u
VIDEOS=${1:-bench/media/distinct}
N=${N_VIDEOS:-3}
OUT=${OUT:-/tmp/first_answer}; mkdir -p "$OUT"
ls "$VIDEOS"/*.mp4 >/dev/null 2>&1 || python3 bench/cli_throughput.py --make-videos "$VIDEOS" --n-videos "$N"
run() {   # name, cache dir, evaluate.py options...
  local name=$1 cache=$2; shift 2
  echo "== $name (cache $cache)"
  TORCHINDUCTOR_CACHE_DIR=$cache TRITON_CACHE_DIR=$cache/triton python3 bench/cli_throughput.py \
    --videos "$VIDEOS" --n-videos "$N" -- "$@" > "$OUT/$(echo "$name" | tr ' ,()' '____').log" 2>&1
  grep -E "^(records|model load|first-video wait|first video|first answer|steady step per video, mean)|^timeline|^warm-up" \
    "$OUT/$(echo "$name" | tr ' ,()' '____').log"
}
TRI=$(mktemp -d); WAIT=$(mktemp -d); EAGER=$(mktemp -d); OLD=$(mktemp -d)
run "triton cold" "$TRI"
run "triton warm" "$TRI"
run "inductor wait cold" "$WAIT" --model.init_args.kernels=inductor
run "inductor wait warm" "$WAIT" --model.init_args.kernels=inductor
run "inductor eager cold" "$EAGER" --model.init_args.kernels=inductor --model.init_args.first_step=eager
run "inductor eager warm" "$EAGER" --model.init_args.kernels=inductor --model.init_args.first_step=eager
run "before issue 41 cold" "$OLD" --model.init_args.early_start=false
