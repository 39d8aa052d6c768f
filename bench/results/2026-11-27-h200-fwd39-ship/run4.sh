#!/usr/bin/env bash
# Final device call: A/B of the shipped forward against 5c0b700, then every GPU test binary and
# the Python GPU tests of the final main. -> $OUT/results.tgz
set -u
cd "$(dirname "$0")/.."
tar xJf .carry-x/bundle.tar.xz
export FLASHCORE_CACHE_DIR=/tmp/fc-cache
md=$(cat .carry-t/manifest_dir); mkdir -p $md/target/release && cp .carry-t/flashcore $md/target/release/flashcore
START=$(date +%s); mkdir -p /tmp/ab /tmp/t
REPS=5 timeout 70 bash .carry-fc/ab.sh "base ship" "64 128" 1 > /tmp/ab/summary.txt 2>&1
echo "bench phase $(( $(date +%s) - START )) s"; tail -36 /tmp/ab/summary.txt
export FLASHCORE_REQUIRE_GPU=1
( python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry-x/*.whl && cd /tmp && PYTHONPATH=/tmp/site timeout 230 python3 -m pytest -q -p no:cacheprovider $OLDPWD/python/tests/test_gpu.py $OLDPWD/python/tests/test_hf.py $OLDPWD/python/tests/test_gpu_varlen.py > /tmp/t/pytest.log 2>&1; echo "pytest rc=$? $(tail -1 /tmp/t/pytest.log)" ) > /tmp/t/py.txt 2>&1 &
ls .carry-t/tests | grep -v gpu_kv_cache | xargs -P 8 -I{} sh -c 'timeout 230 .carry-t/tests/{} --test-threads=1 > /tmp/t/{}.log 2>&1; echo "{} rc=$? $(grep -E "^test result" /tmp/t/{}.log | tail -1)"' | tee /tmp/t/summary.txt
wait; cat /tmp/t/py.txt
echo "total $(( $(date +%s) - START )) s"
tar czf $OUT/results.tgz -C /tmp ab t
