#!/usr/bin/env bash
# FlashAttention-4 (the `flash-attn-4` pre-release on PyPI: CuTe-DSL kernels, JIT-compiled, sm90
# forward) for the side-by-side bench on the GPU machine, which cannot reach PyPI.
#
#   bash scripts/prepare-fa4.sh pack       # here (PyPI reachable): wheels -> .fa4a/ and .fa4b/
#   bash scripts/prepare-fa4.sh stage      # there, first call:  carry .fa4a -> /tmp/fa4-parts
#   bash scripts/prepare-fa4.sh install    # there, next call (machine still warm): carry .fa4b,
#                                          # unpack everything into python3's site-packages
#
# Why two calls: the wheel set is flash-attn-4, nvidia-cutlass-dsl, -libs-base, -libs-core,
# -libs-cu13, apache-tvm-ffi, torch-c-dlpack-ext and quack-kernels (torch, einops, cuda-bindings
# and cuda-pathfinder are already there). nvidia-cutlass-dsl-libs-cu13 alone is 92 MB, over the
# 64 MiB a device call can carry; its files, xz-compressed, are ~61 MiB, so they travel as two
# parts: part 1 in .fa4a (first call, unpacked to /tmp, which survives while the machine is warm,
# i.e. if the next call comes within ~30 s), part 2 and the small wheels in .fa4b. Part 1 is 40 MiB
# because the checkout itself travels with each call (~17 MB of tracked files in November 2026;
# with a 48 MiB part the first call went over 64 MiB). The wheels are
# unzipped straight into site-packages (python3 there is a venv; none of them has scripts or .data),
# so the .pth file of nvidia-cutlass-dsl takes effect.
set -euo pipefail
cd "$(dirname "$0")/.."
FA4_VERSION=4.0.0b36
CUTLASS_DSL_VERSION=4.8.1
PARTS=/tmp/fa4-parts

case "${1:-}" in
pack)
    dl=.fa4-download
    mkdir -p "$dl" .fa4a .fa4b
    plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    for w in "flash-attn-4==$FA4_VERSION" "nvidia-cutlass-dsl==$CUTLASS_DSL_VERSION" \
             "nvidia-cutlass-dsl-libs-base==$CUTLASS_DSL_VERSION" "nvidia-cutlass-dsl-libs-core==$CUTLASS_DSL_VERSION" \
             "nvidia-cutlass-dsl-libs-cu13==$CUTLASS_DSL_VERSION" "apache-tvm-ffi==0.1.15.post2" \
             "torch-c-dlpack-ext==0.1.5" "quack-kernels==0.6.5"; do
        python3 -m pip download -q --no-deps --only-binary=:all: --pre --python-version 3.12 \
            --implementation cp "${plat[@]}" -d "$dl" "$w"
    done
    rm -rf .fa4-unpack && mkdir .fa4-unpack
    (cd .fa4-unpack && unzip -q ../"$dl"/nvidia_cutlass_dsl_libs_cu13-*.whl \
        && rm -rf nvidia_cutlass_dsl/cu13/lib/stubs)  # aarch64/QNX stubs: not needed on x86-64
    tar cf - -C .fa4-unpack . | xz -9 -T2 > .fa4-cu13.tar.xz
    rm -rf .fa4-unpack .fa4a/* .fa4b/*
    split -b 40M .fa4-cu13.tar.xz .fa4a/cu13.part.
    mv .fa4a/cu13.part.ab .fa4b/ 2>/dev/null || true
    find "$dl" -name '*.whl' ! -name 'nvidia_cutlass_dsl_libs_cu13-*' -exec cp {} .fa4b/ \;
    rm -f .fa4-cu13.tar.xz
    du -sh .fa4a .fa4b
    ;;
stage)
    mkdir -p "$PARTS"
    cp .fa4a/cu13.part.* "$PARTS"/
    ls -la "$PARTS"
    ;;
install)
    site="$(python3 -c 'import site; print(site.getsitepackages()[0])')"
    cp .fa4b/cu13.part.* "$PARTS"/ 2>/dev/null || true
    cat "$PARTS"/cu13.part.* | xz -d | tar xf - -C "$site"
    for w in .fa4b/*.whl; do python3 -m zipfile -e "$w" "$site"; done
    python3 -c 'from flash_attn.cute import flash_attn_func; import importlib.metadata as m; print("flash-attn-4", m.version("flash-attn-4"), "imports")'
    ;;
*)
    echo "usage: bash scripts/prepare-fa4.sh pack|stage|install" >&2
    exit 2
    ;;
esac
