#!/usr/bin/env bash
# Installs the pinned CUDA compile/disassembly tools from PyPI into .cuda-tools/ (project-local,
# no GPU and no system CUDA needed). Idempotent. flashcore finds them there by itself.
# The runtime and CCCL wheels are headers only (cuda_fp16.h, cuda_bf16.h, cooperative_groups.h;
# cuda/barrier, nv/target): `flashcore audit --source` hands them to NVRTC for user kernels.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dest="$here/.cuda-tools"
stamp="$dest/.installed-v2"
[ -f "$stamp" ] && exit 0
python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir --target "$dest" --upgrade \
  nvidia-cuda-nvrtc==13.0.88 \
  nvidia-cuda-runtime==13.0.96 \
  nvidia-cuda-cccl==13.0.85 \
  nvidia-cuda-nvdisasm==13.2.78 \
  nvidia-cuda-cuobjdump==13.2.78
touch "$stamp"
echo "CUDA tools installed in $dest"
