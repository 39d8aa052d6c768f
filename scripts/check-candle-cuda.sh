#!/usr/bin/env bash
# Type-checks flashcore-candle with candle's CUDA backend (features `cuda` and `llama-example`:
# the op code, the GPU tests and both examples) on a machine with no CUDA toolkit and no GPU.
# candle's own kernels (the candle-kernels crate) need nvcc at build time, so this installs the
# pinned PyPI nvcc wheels into .cuda-nvcc/ (project-local, idempotent; nvvm and crt pinned to the
# same release, else pip pairs nvcc 13.0 with a newer NVVM whose PTX its ptxas rejects).
# `cargo check` does not link, so no driver, cuBLAS or cuRAND libraries are needed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dest="$here/.cuda-nvcc"
stamp="$dest/.installed-v1"
if [ ! -f "$stamp" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir --target "$dest" --upgrade \
    nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
  touch "$stamp"
fi
export CUDA_HOME="$dest/nvidia/cu13"
export PATH="$CUDA_HOME/bin:$PATH"
# candle-kernels builds for one architecture, found with nvidia-smi unless given: Hopper.
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
cd "$here"
cargo check --release -p flashcore-candle --features llama-example --all-targets
