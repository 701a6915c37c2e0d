#!/bin/bash
# Session 12, call 1 (as prepared in session 11 in device_next.sh; H100): the GPU tests again (two
# fixed for kernels: triton), then the user's CLI on the whole workload-shaped set: kernels triton (the default; a
# fresh machine, so Triton's cache is cold), kernels eager (the library's own kernels: the records compared with
# triton's are the exactness check of the Triton kernels), triton with model.warm_first_calls=true (first calls set
# up beside the load now that no compilation shares the GIL), triton again (warm Triton cache).
#   bash bench/device_next.sh                             (carry .whl)
set -u
. bench/device_site.sh
gpu_tests_start
set_and_checkpoint
timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
  --workers 16 --cli --cli-decoders auto auto/model.kernels=eager auto/model.warm_first_calls=true auto \
  --json "$OUT/cli_kernels.json" > "$OUT/cli_kernels.txt" 2>&1
echo "rc $?"; grep -E "^CLI.*(videos,|stages|timeline)|records identical|differing fields|Traceback|Error" \
  "$OUT/cli_kernels.txt" | cut -c1-600 | head -30
stamp "CLI"
gpu_tests_report
