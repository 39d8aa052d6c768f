#!/usr/bin/env bash
# bwdhd: GPU tests (Rust binaries + pytest, concurrently), then the d96/d256 backward benches.
set -u
cd "$(dirname "$0")/.."
C=.carry-bwdhd
export FLASHCORE_REQUIRE_GPU=1 FLASHCORE_CACHE_DIR=/tmp/fcc-bwdhd FLASHCORE_BIN=$PWD/$C/flashcore
md="$(cat $C/manifest_dir)"; mkdir -p "$md/target/release" && cp $C/flashcore "$md/target/release/flashcore"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat $C/commit
rm -rf /tmp/site; python3 -m pip install -q --no-deps --target /tmp/site $C/*.whl 2>&1 | tail -1
# Warm the JIT cache for the new variants once (compiles are shared by the concurrent jobs).
run_bin() { local t=$1 s=$(date +%s); if timeout ${LIM:-150} $C/tests/$t --test-threads=${TT:-4} > $OUT/test-$t.log 2>&1; then r=PASS; else r="FAIL(rc=$?)"; fi
  echo "$r $t ($(( $(date +%s) - s ))s): $(grep -E '^test result|panicked' $OUT/test-$t.log | head -3 | tr '\n' ' ')"; }
run_py() { local f=$1 k=$2 s=$(date +%s); (cd /tmp && PYTHONPATH=/tmp/site:$OLDPWD/$C/pytests timeout ${LIM:-150} python3 -m pytest -q -p no:cacheprovider -rs -s $OLDPWD/$C/pytests/$f -k "$k" > $OUT/py-$f.log 2>&1); r=$?
  echo "pytest $f rc=$r ($(( $(date +%s) - s ))s): $(tail -1 $OUT/py-$f.log)"; }
for t in $(ls $C/tests); do run_bin $t & done
run_py test_gpu.py "gradients_match_float64 or head_dims_96_256 or hf_training_step" &
run_py test_hf.py "what_sdpa_expresses" &
wait; date -u
grep -h "worst relative\|seed" $OUT/test-gpu_backward_hd*.log | head -12
grep -h "hf training" $OUT/py-test_gpu.py.log | head
# Benches (bf16, event timing, backward alone and f+b), one shape at a time, nothing else running.
for s in "4 32 32 2048 96 --causal" "2 16 16 8192 96" "4 16 8 2048 256 --causal" "2 16 8 4096 256"; do
  set -- $s
  timeout 40 $C/flashcore bench --backward --batch $1 --heads $2 --heads-kv $3 --seqlen $4 --headdim $5 ${6:-} --dtype bf16 --reps 15 --warmup 3 --mode event --json $OUT/fc-$1-$2-$4-$5${6:+-causal}.json > $OUT/fc-$1-$2-$4-$5${6:+-causal}.txt 2>&1; echo "fc rc=$?"; tail -4 $OUT/fc-$1-$2-$4-$5${6:+-causal}.txt
  PYTHONPATH=/tmp/site timeout 60 python3 $C/sdpa.py --backward --batch $1 --heads $2 --heads-kv $3 --seqlen $4 --headdim $5 ${6:-} --dtype bf16 --reps 15 --warmup 3 --mode event --backends flash,cudnn --json $OUT/sdpa-$1-$2-$4-$5${6:+-causal}.json > $OUT/sdpa-$1-$2-$4-$5${6:+-causal}.txt 2>&1; echo "sdpa rc=$?"; tail -8 $OUT/sdpa-$1-$2-$4-$5${6:+-causal}.txt
done
date -u
