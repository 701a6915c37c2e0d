#!/bin/bash
# The decode feed on the lent H200 (issue 40): what the NVDEC pool's rate is bound by.
#   bash bench/device_decode.sh            (writes under $OUT when set; STEPS picks the sections)
# capacity: many long videos in flight (--copies), with the per-stage seconds of every read (check, scan, demux,
#           Decode, copy, convert) and the CPU / NVDEC / SM busy shares;
# mix:      the Video-MME-shaped set, 3 copies in flight with 16 workers (the engines' capacity on the mix, the
#           figure the full-run simulation uses), then the user's CLI on the whole set at full length (decoder auto);
# records:  the CLI with decoder=cpu and decoder=auto on the whole set, records compared byte for byte.
# The wheels come from .whl/site312.tar.xz (bench/make_device_site.sh builds it on the CPU machine).
set -u
source bench/device_site.sh   # T0, stamp, OUT; the wheels on PYTHONPATH
nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
stamp "site"
python3 bench/workload.py --make /tmp/wl 2>&1 | tail -1; stamp "set made"
STEPS=${STEPS:-capacity mix}
WIN=${WIN:-600}
case " $STEPS " in *" capacity "*)
  CW=${CAP_WORKERS:-8}; CS=${CAP_SESSIONS:-4}; CC=${CAP_COPIES:-8}
  echo "== capacity: nvdec, $CC copies of the long video in flight (first ${WIN} s of each), $CW workers x $CS sessions"
  timeout 300 python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers $CW --sessions $CS --only long \
    --copies $CC --window-s $WIN --json "$OUT/capacity_nvdec.json" 2>&1 | grep -E "pool of|busy while|stages|not decoded|Video-MME" | head -8
  stamp "capacity";;
esac
case " $STEPS " in *" mix "*)
  echo "== mix: the set x 3 in flight, 16 workers, then the CLI (decoder auto) on the whole set at full length"
  timeout 560 python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 16 --copies 3 --cli \
    --cli-decoders auto --json "$OUT/mix.json" 2>&1 | grep -v -E "^\s*(videomme|acc%|±95|robust|differences|scores:|report:)|WARN" > "$OUT/mix.txt"
  grep -E "pool of|busy while|not decoded|^CLI|Video-MME|class|^short|^medium|^long|GPU step|needs|Error|error" "$OUT/mix.txt" | head -40
  stamp "mix";;
esac
case " $STEPS " in *" records "*)
  echo "== records: the CLI on the whole set, decoder cpu vs auto"
  timeout 560 python3 bench/workload.py --videos /tmp/wl --paths nvdec --workers 16 --only short --cli \
    --cli-decoders cpu auto --json "$OUT/records.json" 2>&1 | grep -E "^CLI|records identical" | tail -10
  stamp "records";;
esac
