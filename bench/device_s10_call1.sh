#!/bin/bash
# Session 10, call 1 (2026-12-06; prepared in session 9 as bench/device_next.sh, run as it was) (session 9's device time was spent on its
# CLI runs): (1) the GPU tests (tests/test_gpu.py, tests/datamodules/test_nvdec.py with the clips carried);
# (2) Inductor compiling in the run's process (cli.compile_kernels_in_process, new: compile_threads 1) against its
#     pool (TORCHINDUCTOR_COMPILE_THREADS=16), and the first-call warm-up: the user's CLI on the whole set, defaults
#     cold, then warm in-process,
#     warm without the first-call warm-up (model.warm_first_calls=false, new), warm pool, warm in-process again;
#     first answer, the first step's stages against the others', early_compile seconds, records compared.
# Session 9's bench/device_next2.sh (extraction rows, QA bench) ran as calls 2 and 3 (docs/performance.md, session 10).
#   python bench/make_nvdec_clips.py .whl/nvdec_clips     (on the CPU machine, once)
#   bash bench/device_s10_call1.sh                            (carry .whl; NVDEC_TEST_CLIPS reads .whl/nvdec_clips)
set -u
. bench/device_site.sh
export NVDEC_TEST_CLIPS=$PWD/.whl/nvdec_clips
( timeout 170 python3 -m pytest -q -p no:hypothesispytest -p no:cacheprovider -m gpu tests/test_gpu.py \
    tests/datamodules/test_nvdec.py > "$OUT/gpu_tests.txt" 2>&1 ) &
set_and_checkpoint
wait; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu_tests.txt" | head -12; stamp "gpu tests"
cli() {   # cli <name> <variants...>: the whole set through the user's CLI, 16 workers
  local name=$1; shift
  timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths nvdec --only short \
    --workers 16 --cli --cli-decoders "$@" --json "$OUT/cli_$name.json" > "$OUT/cli_$name.txt" 2>&1
  echo "rc $?"; grep -E "^CLI.*(videos,|timeline|stages)|records identical|differing fields|Traceback|Error" \
    "$OUT/cli_$name.txt" | cut -c1-700 | head -12
  stamp "CLI $name"
}
cli inprocess auto auto auto/model.warm_first_calls=false
TORCHINDUCTOR_COMPILE_THREADS=16 cli pool auto
cli inprocess_again auto
