#!/bin/bash
# Prepared in session 15 for the next session's first call (no device time was left to run it): the rank's small
# first video now asks NVDEC only its stream's reasons (no device query; session 15's probe: that query waited
# ~3 s in the driver beside 15 workers' first NVDEC calls, and the first video's CPU read took 4.0-4.2 s, 2.5 s in the
# run where those calls were taken in turn). Files in $OUT (bundled out.tgz):
#   (1) the GPU tests;
#   (2) the user's CLI on the whole workload-shaped set, 16 workers, one Triton cache (cold in the first run), fresh
#       processes, session 15's code before that change (e977863, carried as .old) and after, alternated; records
#       compared with the first run's (bench/workload.py: decoder fields left out, as the first video's reason may
#       differ only where the device alone ruled NVDEC out).
# Make .old first:  mkdir -p .old && git archive e977863 -- algorithms bench callbacks configs datamodules \
#   lightning_modules models evaluate.py cli.py train.py pyproject.toml ':!bench/results' ':!bench/media' \
#   | tar -x -C .old   (and add /.old/ to .git/info/exclude)
#   bash bench/device_next.sh                             (carry .whl and .old)
set -u
. bench/device_site.sh
# is CUDA MPS at hand (the next call may run the CLI under it: one shared context for the decode workers and the step)?
{ command -v nvidia-cuda-mps-control nvidia-smi; nvidia-smi -q | grep -iE "compute mode|product name|mig mode" -A1 | head -8; } 2>&1 | tee "$OUT/mps_check.txt"
gpu_tests_start
set_and_checkpoint
gpu_tests_report
export TRITON_CACHE_DIR=/tmp/triton_cli CLI_END=${CLI_END:-430}
workload_cli old1 .old auto
workload_cli new1 . auto
workload_cli old2 .old auto
workload_cli new2 . auto
for n in new1 new2; do   # records of each new run against the second old one (the decoder fields left out)
  python3 -c "import json, sys; sys.path.insert(0, 'bench'); import workload as w; o = lambda l: w.Path(json.load(open(
f'$OUT/cli_{l}.json'))['cli_runs']['auto']['out']); print('$n vs old2:', *w.compare_records(o('old2'), o('$n')))"
done
bundle_out
