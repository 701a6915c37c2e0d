#!/bin/bash
# Session 17, call 3, after the run's own MPS daemon became the default (TOKENBUDGET_MPS unset = auto):
# (1) bench/mps_probe.py again (call 2's fault case indexed inside the tensor: no fault was made); (2) the GPU tests
# (tests/test_gpu.py runs predict, now under MPS by default; the NVDEC tests) beside the set's making; (3) the
# user's CLI, defaults, on the whole workload-shaped set (Triton cache cold in the first run) against
# TOKENBUDGET_MPS=0, alternated, records compared with the first run's.
#   bash bench/device_s17_call3.sh                        (carry .whl)
set -u
. bench/device_site.sh
python3 bench/mps_probe.py 2>&1 | tee "$OUT/mps_probe.txt"
stamp "mps probe"
gpu_tests_start
set_and_checkpoint
gpu_tests_report
export TRITON_CACHE_DIR=/tmp/triton_cli
CLI_END=540 workload_cli defaults . auto auto/env.TOKENBUDGET_MPS=0 auto auto/env.TOKENBUDGET_MPS=0
bundle_out
