"""Where the Rust side finds NVRTC: a CUDA toolkit (``$CUDA_HOME``, ``/usr/local/cuda``) or the
``nvidia-cuda-nvrtc`` wheel that PyTorch's CUDA wheels (or ``pip install flashcore[nvrtc]``)
install. The wheel's folder is handed over through ``FLASHCORE_CUDA_TOOLS`` unless the user set it."""

import importlib.util
import os
from pathlib import Path


def nvrtc_wheel_root():
    """The folder of the pip-installed NVRTC (``lib/libnvrtc.so.*`` inside), or None."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        for sub in ("cu13", "cuda_nvrtc"):  # CUDA 13 wheels, then CUDA 12's layout
            root = Path(base) / sub
            if any((root / "lib").glob("libnvrtc.so.*")):
                return root
    return None


def setup():
    if os.environ.get("FLASHCORE_CUDA_TOOLS"):
        return
    root = nvrtc_wheel_root()
    if root is not None:
        os.environ["FLASHCORE_CUDA_TOOLS"] = str(root)
