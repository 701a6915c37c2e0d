#!/bin/bash
# Session 18, the short call left after refused starts took most of the device time: only the pool of
# bench/device_s18_call1.sh (does data.cpu_slots raise the feed?): the 18-video pool (session 8's: 3 copies, every
# video whole) with nvdec / 16 workers, hybrid / 20 workers and 4 CPU slots of 2 threads, nvdec / 20 workers.
#   bash bench/device_s18_pool.sh                         (carry .whl)
set -u
. bench/device_site.sh
python3 bench/workload.py --make /tmp/wl > /dev/null 2>&1; stamp "set made"
pool() {   # $1: label, $2: deadline (s after the start), $3: path, $4: workers, $5: CPU slots
  timeout $(( $2 - ($(date +%s) - T0) )) python3 bench/workload.py --videos /tmp/wl --paths "$3" \
    --workers "$4" --cpu-slots "${5:-0}" --copies 3 --part-mb 0 --json "$OUT/pool_$1.json" > "$OUT/pool_$1.txt" 2>&1
  echo "rc $? ($1)"; grep -E "busy while decoding|every worker was busy|full Video-MME" "$OUT/pool_$1.txt" \
    | grep -v "^  " | cut -c1-330
  echo "  videos on a CPU slot: $(grep -c 'CPU slot' "$OUT/pool_$1.txt")"
  stamp "pool $1"
}
pool nvdec16 150 nvdec 16
pool hybrid20k4 215 hybrid 20 4
pool nvdec20 265 nvdec 20
bundle_out
