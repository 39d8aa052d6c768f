#!/usr/bin/env bash
# A/B of flashcore binaries (graph replay), then the forward GPU tests. Usage: ab.sh "bins" "dims" rounds
set -u
cd "$(dirname "$0")/.."
R=/tmp/ab; mkdir -p $R
bins="$1"; dims="$2"; rounds="$3"
export FLASHCORE_CACHE_DIR=/tmp/fc-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
(while true; do nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader; sleep 1; done) > $R/clocks.txt 2>&1 &
CLK=$!
for r in $(seq 1 $rounds); do
  order="$bins"; [ $((r % 2)) -eq 0 ] && order=$(echo $bins | tr ' ' '\n' | tac | tr '\n' ' ')
  for b in $order; do
    for d in $dims; do
      dt=bf16; dd=$d; case $d in f*) dt=f16; dd=${d#f};; esac
      echo "== round $r bin $b d$dd $dt $(date +%T)"
      timeout ${RUN_LIMIT:-90} .carry-fc2/flashcore-$b bench --suite fa3 --dtype $dt --headdim $dd --mode graph --graph-calls 10 --graph-reps ${REPS:-6} --warmup 3 --json $R/r$r-$b-$dt-d$dd.json > $R/r$r-$b-$dt-d$dd.txt 2>&1 || echo FAIL $?
    done
  done
done
kill $CLK; tar czf $OUT/ab.tgz -C /tmp ab 2>/dev/null
python3 - "$R" <<'PY'
import json, glob, sys, collections, os
R = sys.argv[1]
t = collections.defaultdict(dict)
for f in sorted(glob.glob(R + "/r*-*.json")):
    r, b = os.path.basename(f).split("-")[:2]
    d = json.load(open(f))
    recs = d["records"] if isinstance(d, dict) and "records" in d else d
    for x in recs:
        if x.get("status") != "ok": continue
        s = x["shape"]
        key = (x["dtype"], s["head_dim"], s["causal"], s["batch"], s["seqlen_q"])
        t[key].setdefault(b, []).append(x["time_us"]["median"])
bins = sys.argv[2:] if len(sys.argv) > 2 else None
for k in sorted(t, key=str):
    row = t[k]
    base = min(row.get(os.environ.get("BASE","x0"), [0]) or [0])
    cells = " ".join(f"{b}:{min(v):.1f}" + (f"({min(v)/base:.3f})" if base else "") for b, v in sorted(row.items()))
    print(k, cells)
PY
