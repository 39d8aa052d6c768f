"""The gate of the GPU test files: they skip visibly without a usable GPU (an sm_90 device 0), and
with FLASHCORE_REQUIRE_GPU=1 they fail to import instead. Each file sets
``pytestmark = gpu_gate.skip_without_gpu``."""

import os

import pytest
import torch


def _gpu_reason():
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability(0) != (9, 0):
        return "device 0 is %s, not sm_90" % torch.cuda.get_device_name(0)
    return None


REASON = _gpu_reason()
if REASON and os.environ.get("FLASHCORE_REQUIRE_GPU") == "1":
    raise RuntimeError("FLASHCORE_REQUIRE_GPU=1 but no usable GPU: " + REASON)
skip_without_gpu = pytest.mark.skipif(REASON is not None, reason="SKIPPED: no usable GPU (%s)" % REASON)
