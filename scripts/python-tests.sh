#!/usr/bin/env bash
# The Python package's tests (python/tests): a virtual environment in .venv-py/ with PyPI's torch
# (its CUDA wheel imports on a machine without a GPU; ~1 min, ~4.6 GB with its CUDA libraries),
# transformers and pytest, then flashcore built from ./python by pip (maturin; reuses target/).
# GPU tests skip visibly without an sm_90 GPU. Called by scripts/test.sh; FLASHCORE_PYTHON_TESTS=0
# skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${FLASHCORE_PYTHON_TESTS:-1}" == "0" ]]; then
    echo "== python tests: skipped (FLASHCORE_PYTHON_TESTS=0)"
    exit 0
fi
venv="${FLASHCORE_PY_VENV:-.venv-py}"
py="$venv/bin/python"
if [[ ! -x "$py" ]]; then
    python3 -m venv "$venv"
fi
# Pinned to what the GPU machine runs, so CPU and GPU results speak of the same versions.
"$py" -m pip install -q --disable-pip-version-check torch==2.11.0 transformers==5.17.0 numpy pytest
"$py" -m pip install -q --disable-pip-version-check ./python
echo "== python tests"
# From the repository root, so `import flashcore` finds the installed package, not python/flashcore.
"$py" -m pytest -q -rs -p no:cacheprovider python/tests
