#!/bin/bash
# Session 17, call 2: (1) bench/mps_probe.py: two runs' own MPS daemons at once, and a fatal fault in one client
# beside another (under one daemon and without MPS): may the run's daemon be the default? (2) the CLI on the whole
# workload-shaped set under MPS, the Triton cache cold (the first answer cold), then steps 2, 3, 5 under
# callbacks.step_profile under MPS (call 1's sixth run, cut there).
#   bash bench/device_s17_call2.sh                        (carry .whl)
set -u
. bench/device_site.sh
python3 bench/mps_probe.py 2>&1 | tee "$OUT/mps_probe.txt"
stamp "mps probe"
set_and_checkpoint
export TRITON_CACHE_DIR=/tmp/triton_cli
P=env.BENCH_STEP_PROFILE=2,3,5 M=env.TOKENBUDGET_MPS=1
CLI_END=450 workload_cli mps . auto/$M auto/$M/$P
step_profile_summary "$OUT/cli_mps.json" 300
bundle_out
