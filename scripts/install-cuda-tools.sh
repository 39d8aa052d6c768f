#!/usr/bin/env bash
# Installs the pinned CUDA compile/disassembly tools from PyPI into .cuda-tools/ (project-local,
# no GPU and no system CUDA needed). Idempotent. flashcore finds them there by itself.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dest="$here/.cuda-tools"
stamp="$dest/.installed-v1"
[ -f "$stamp" ] && exit 0
python3 -m pip install --quiet --disable-pip-version-check --target "$dest" --upgrade \
  nvidia-cuda-nvrtc==13.0.88 \
  nvidia-cuda-nvdisasm==13.2.78 \
  nvidia-cuda-cuobjdump==13.2.78
touch "$stamp"
echo "CUDA tools installed in $dest"
