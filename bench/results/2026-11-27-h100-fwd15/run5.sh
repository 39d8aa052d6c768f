#!/usr/bin/env bash
# GPU verification of the build in .carry-x/bundle.tar.xz: every GPU, CLI, bench and leakage test
# binary with FLASHCORE_REQUIRE_GPU=1 (the audit binaries run in CI). -> $OUT/tests.tgz
set -u
cd "$(dirname "$0")/.."
tar xJf .carry-x/bundle.tar.xz
export FLASHCORE_CACHE_DIR=/tmp/fc-cache FLASHCORE_REQUIRE_GPU=1
md=$(cat .carry/manifest_dir); mkdir -p $md/target/release && cp .carry/flashcore $md/target/release/flashcore
START=$(date +%s); mkdir -p /tmp/t
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee /tmp/t/gpu.txt; cat .carry/commit | tee -a /tmp/t/gpu.txt
ls .carry/tests | grep -E "^(gpu_|cli_|bench_gpu|bench_cli|bench_varlen|leakage_gpu|leakage_decode|leakage_cli|fuzz|dsink)" | xargs -P ${PAR:-6} -I{} sh -c 'timeout ${LIM:-400} .carry/tests/{} --test-threads=2 > /tmp/t/{}.log 2>&1; echo "{} rc=$? $(grep -E "^test result" /tmp/t/{}.log | tail -1)"' | sort | tee /tmp/t/summary.txt
echo "total $(( $(date +%s) - START )) s"
tar czf $OUT/tests.tgz -C /tmp t
