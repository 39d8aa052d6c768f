#!/usr/bin/env bash
# One pass vs two passes (FLASHCORE_BWD_ONEPASS=1|0) at the lengths between the measured 2048 and 8192.
set -u
cd "$(dirname "$0")"
export FLASHCORE_CACHE_DIR=/tmp/fc-cache
W=/tmp/bwd; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2; do
  for shape in "4 16 4096 128 -" "2 16 8192 128 -" "4 32 4096 64 --causal" "2 32 8192 64 --causal" "4 32 4096 64 -" "2 32 8192 64 -" "8 16 2048 128 -"; do
    set -- $shape; c=""; [ "$5" = "--causal" ] && c=--causal
    order="0 1"; [ $r = 2 ] && order="1 0"
    for op in $order; do
      FLASHCORE_BWD_ONEPASS=$op timeout 60 ./flashcore-x0 bench --backward --batch $1 --heads $2 --seqlen $3 --headdim $4 $c --dtype bf16 --mode graph --graph-calls 10 --graph-reps 6 --warmup 3 --json $W/r$r-$1-$3-$4$c-op$op.json > $W/r$r-$1-$3-$4$c-op$op.txt 2>&1 || echo "FAIL $shape $op"
    done
  done
done
python3 - <<'PY'
import json, glob, os, collections
t = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob('/tmp/bwd/r*.json')):
    name = os.path.basename(f)[3:-5]; shape, op = name.rsplit('-op', 1)
    d = json.load(open(f)); recs = d["records"] if isinstance(d, dict) and "records" in d else d
    for x in recs:
        if x.get("status") == "ok": t[shape][op].append(round(x["time_us"]["median"], 1))
for s in t: 
    a, b = min(t[s]['0']), min(t[s]['1'])
    print(f"{s:22s} two-pass {t[s]['0']} one-pass {t[s]['1']}  one/two {b/a:.3f}")
PY
tar czf $OUT/bwd.tgz -C /tmp bwd
