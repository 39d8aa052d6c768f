#!/usr/bin/env bash
# The project's test command (README): installs the pinned CUDA compile/disassembly tools into
# .cuda-tools/ if needed, then runs the whole test suite: the Python package's first
# (scripts/python-tests.sh: torch from PyPI in .venv-py/, ~5 GB: installed while the least else
# is on the disk), then the Rust crate's and the candle crate's. GPU tests skip with a visible
# message on a machine without a GPU; FLASHCORE_REQUIRE_GPU=1 turns those skips into failures.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-cuda-tools.sh
bash scripts/python-tests.sh
cargo test --release "$@"
# The candle crate (flashcore-candle/): argument checks without a GPU; its GPU tests need the
# `cuda` feature (candle's CUDA backend) and skip visibly without it.
cargo test --release -p flashcore-candle
