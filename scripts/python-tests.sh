#!/usr/bin/env bash
# The Python package's tests (python/tests): a virtual environment in .venv-py/ with PyPI's torch
# (its CUDA wheel imports on a machine without a GPU; ~1 min, ~4.9 GB with its CUDA libraries),
# transformers and pytest, then flashcore built from ./python by pip (maturin; reuses target/).
# GPU tests skip visibly without an sm_90 GPU. Called by scripts/test.sh; FLASHCORE_PYTHON_TESTS=0
# skips it. pip keeps no download cache (the wheels would take ~3 GB more);
# FLASHCORE_PY_VENV_DISPOSABLE=1 (CI's one-shot clone) removes the environment after the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${FLASHCORE_PYTHON_TESTS:-1}" == "0" ]]; then
    echo "== python tests: skipped (FLASHCORE_PYTHON_TESTS=0)"
    exit 0
fi
venv="${FLASHCORE_PY_VENV:-.venv-py}"
py="$venv/bin/python"
if [[ "${FLASHCORE_PY_VENV_DISPOSABLE:-0}" == "1" ]]; then
    trap 'rm -rf "$venv"' EXIT
fi
if [[ ! -x "$py" ]]; then
    python3 -m venv "$venv"
fi
pip_install() {
    "$py" -m pip install -q --disable-pip-version-check --no-cache-dir "$@"
}
# Pinned to what the GPU machine runs, so CPU and GPU results speak of the same versions. torch's
# largest wheels go in one at a time first (the versions torch 2.11.0 pins): pip holds every
# downloaded wheel until all are installed (~3 GB beside the ~5 GB installed), one by one only one.
for wheel in nvidia-cudnn-cu13==9.19.0.56 nvidia-cublas==13.1.0.3 nvidia-cusparse==12.6.3.3 \
    nvidia-nccl-cu13==2.28.9 nvidia-cusparselt-cu13==0.8.0 nvidia-cusolver==12.0.4.66 \
    nvidia-cufft==12.0.0.61 nvidia-nvshmem-cu13==3.4.5 triton==3.6.0; do
    "$py" -m pip show -q "${wheel%%==*}" >/dev/null 2>&1 || pip_install --no-deps "$wheel"
done
pip_install torch==2.11.0 transformers==5.17.0 numpy pytest
pip_install ./python
echo "== python tests"
# From the repository root, so `import flashcore` finds the installed package, not python/flashcore.
"$py" -m pytest -q -rs -p no:cacheprovider python/tests
