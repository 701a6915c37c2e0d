#!/bin/bash
# Session 12, call 3 (H100; two starts refused before it, ~290 s of device time left after the start): three
# commands back to back on one warm machine (files bench/results/s12call3_*_h100_2026-12-06.*):
#   (a) the GPU tests and the set, then one CLI run with the defaults (a Triton cache of its own, empty): the tests
#       passed; the CLI run answered the set but was cut by the call's limit before its summary (s12call3_cli_cut)
DEADLINE=150 CLI_END=150 CLI_RUNS="auto" bash bench/device_next.sh
#   (b) the defaults twice more (Triton's cache now filled by (a)'s run)
#   (c) model.warm_first_calls=false once, on the same warm machine
#   (as run: each command sourced bench/device_site.sh, exported TRITON_CACHE_DIR=/tmp/triton_cli and called)
#   python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short --workers 16 --cli \
#     --cli-decoders auto auto                              --json "$OUT/cli_defaults.json"      (b)
#     --cli-decoders auto/model.warm_first_calls=false      --json "$OUT/cli_nofirst.json"       (c)
