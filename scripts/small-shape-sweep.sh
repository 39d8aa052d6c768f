#!/usr/bin/env bash
# Issue 14's measurement: graph-replay latency of the latency shapes under each tile
# configuration (the FLASHCORE_BLOCK_M / FLASHCORE_BLOCK_N / FLASHCORE_SPLIT tuning knobs), and
# the launch floor (a one-element kernel in the same kind of graph, through PyTorch).
#   bash scripts/small-shape-sweep.sh [FLASHCORE_BINARY] [CONFIGS...]
# A config is "M=128,S=2" (unset knobs keep the shape rule); "base" is the shape rule alone.
# The knobs select shipped (audited) variants only: a combination that is not shipped (64-key
# blocks, 64-row split tiles; measured in PERF_NOTES step 13 before this rule) runs the shape rule.
# Writes one JSON per (config, shape) and sweep.txt to $OUT (else sweep-out/).
set -uo pipefail
B=${1:-.carry/flashcore}
shift || true
configs=("$@")
[[ ${#configs[@]} -eq 0 ]] && configs=(base M=64 M=128 M=128,S=2 M=128,S=4)
out=${OUT:-sweep-out}
mkdir -p "$out"
shapes=(${SHAPES:-"1,8,512,64,full" "1,8,512,64,causal" "1,16,1024,64,causal"})
for dt in ${DTYPES:-f16}; do
for cfg in "${configs[@]}"; do
    envs=()
    IFS=, read -ra kv <<<"$cfg"
    for x in "${kv[@]}"; do
        case $x in
        M=*) envs+=("FLASHCORE_BLOCK_M=${x#M=}") ;;
        N=*) envs+=("FLASHCORE_BLOCK_N=${x#N=}") ;;
        S=*) envs+=("FLASHCORE_SPLIT=${x#S=}") ;;
        esac
    done
    for sh in "${shapes[@]}"; do
        IFS=, read -r b h s d c <<<"$sh"
        flag=(); [[ $c == causal ]] && flag=(--causal)
        name="${dt}_${cfg//[=,]/}_${b}x${h}x${s}x${d}_${c}"
        env "${envs[@]}" "$B" bench --batch "$b" --heads "$h" --seqlen "$s" --headdim "$d" "${flag[@]}" \
            --dtype "$dt" --mode graph --graph-reps ${REPS:-200} --json "$out/$name.json" >/dev/null 2>"$out/$name.err" \
            || echo "FAILED $name: $(tail -2 "$out/$name.err")"
    done
done
done
python3 - "$out" <<'PY' | tee "$out/sweep.txt"
import json, sys, glob, os
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    name = os.path.basename(f)[:-5]
    dt, cfg, shape = name.split("_", 2)
    for r in json.load(open(f))["records"]:
        if r["status"] == "ok":
            rows.setdefault((dt, shape), {})[cfg] = r["time_us"]["median"]
cfgs = sorted({c for v in rows.values() for c in v})
print("graph replay median µs per call")
print(f"{'dtype':5} {'shape':24}" + "".join(f"{c:>12}" for c in cfgs))
for (dt, shape), v in sorted(rows.items()):
    print(f"{dt:5} {shape:24}" + "".join(f"{v.get(c, float('nan')):12.2f}" for c in cfgs))
PY
