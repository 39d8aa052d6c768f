//! The CUDA sources we ship and the variants they are compiled into. Sources live in
//! `kernels/` at the repository root and are embedded at build time; NVRTC gets the headers
//! in memory, so no toolkit headers or files on disk are needed at run time.

use crate::attention::params::DType;
use crate::error::Result;
use crate::jit::{self, Header};

/// Symbol of the forward kernel in every variant's cubin.
pub const FORWARD_SYMBOL: &str = "flashcore_attention_fwd";

const FORWARD_SOURCE: &str = include_str!("../../kernels/attention_fwd.cu");

/// Headers by the name the sources `#include` them.
pub const HEADERS: &[(&str, &str)] = &[
    ("fc_common.cuh", include_str!("../../kernels/fc_common.cuh")),
    (
        "fc_mbarrier.cuh",
        include_str!("../../kernels/fc_mbarrier.cuh"),
    ),
    ("fc_tma.cuh", include_str!("../../kernels/fc_tma.cuh")),
    ("fc_wgmma.cuh", include_str!("../../kernels/fc_wgmma.cuh")),
    (
        "fc_wgmma_ops.cuh",
        include_str!("../../kernels/fc_wgmma_ops.cuh"),
    ),
    (
        "fc_softmax.cuh",
        include_str!("../../kernels/fc_softmax.cuh"),
    ),
];

fn headers() -> Vec<Header<'static>> {
    HEADERS
        .iter()
        .map(|(name, source)| Header { name, source })
        .collect()
}

/// Tile shape and pipeline depth of a variant. Decided here, passed to the kernel as defines, so
/// host (grid, shared-memory size) and device agree by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    /// Query rows per CTA (64 per consumer warpgroup).
    pub block_m: usize,
    /// Keys per pipeline stage.
    pub block_n: usize,
    /// Depth of the K/V shared-memory ring.
    pub stages: usize,
    /// Consumer warpgroups.
    pub consumers: usize,
}

impl Tile {
    pub fn threads(&self) -> usize {
        128 * (1 + self.consumers)
    }
    /// Dynamic shared memory: Q tile, K and V rings, mbarriers, plus 1 KiB of alignment slack.
    pub fn smem_bytes(&self, head_dim: usize) -> usize {
        let q = self.block_m * head_dim * 2;
        let kv = 2 * self.stages * self.block_n * head_dim * 2;
        let barriers = (1 + 4 * self.stages) * 8;
        q + kv + barriers + 1024
    }
}

/// One compiled specialisation of the forward kernel. Everything that distinguishes variants
/// is public (DESIGN.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Variant {
    pub dtype: DType,
    pub head_dim: usize,
    pub causal: bool,
    /// Query rows per CTA: 64 per consumer warpgroup (128 or 192).
    pub block_m: usize,
    /// Secret-length mode: per-batch true lengths from device memory mask keys and zero rows.
    pub secret_len: bool,
}

impl Variant {
    /// A stable, human-readable name, e.g. `fwd_bf16_d128_causal`.
    pub fn name(&self) -> String {
        format!(
            "fwd_{}_d{}_{}_m{}{}",
            self.dtype.name(),
            self.head_dim,
            if self.causal { "causal" } else { "full" },
            self.block_m,
            if self.secret_len { "_slen" } else { "" }
        )
    }

    /// The variant for a call's shape. At d64, three consumer warpgroups (192 query rows per CTA)
    /// read fewer K/V bytes from L2 per FLOP and keep more softmax work in flight, but make fewer
    /// CTAs: they are used only when there are enough tiles to fill the chip twice over, and
    /// only without the causal mask (measured: no gain there). Public shapes only.
    pub fn for_shape(
        dtype: DType,
        head_dim: usize,
        causal: bool,
        secret_len: bool,
        batch: usize,
        heads: usize,
        seqlen_q: usize,
        num_sms: usize,
    ) -> Variant {
        let tiles_192 = seqlen_q.div_ceil(192) * batch * heads;
        let block_m = if head_dim == 64 && !causal && !secret_len && tiles_192 >= 2 * num_sms {
            192
        } else {
            128
        };
        Variant {
            dtype,
            head_dim,
            causal,
            block_m,
            secret_len,
        }
    }

    pub fn tile(&self) -> Tile {
        let stages = if self.head_dim == 64 { 4 } else { 2 };
        Tile {
            block_m: self.block_m,
            block_n: 128,
            stages,
            consumers: self.block_m / 64,
        }
    }

    pub fn options(&self) -> Vec<String> {
        let t = self.tile();
        let mut o = jit::base_options();
        o.push(format!("-DFC_BLOCK_M={}", t.block_m));
        o.push(format!("-DFC_BLOCK_N={}", t.block_n));
        o.push(format!("-DFC_STAGES={}", t.stages));
        o.push(format!("-DFC_CONSUMERS={}", t.consumers));
        o.push(format!("-DFC_HEAD_DIM={}", self.head_dim));
        o.push(format!("-DFC_BF16={}", (self.dtype == DType::Bf16) as u8));
        o.push(format!("-DFC_CAUSAL={}", self.causal as u8));
        o.push(format!("-DFC_SECRET_LEN={}", self.secret_len as u8));
        o
    }

    /// The cubin, through the on-disk cache. Needs NVRTC, not a GPU.
    pub fn cubin(&self) -> Result<Vec<u8>> {
        jit::compile_cached(&self.name(), FORWARD_SOURCE, &headers(), &self.options())
    }

    /// Ordinals of kernel parameters that hold secrets (none: secrets reach the kernel only
    /// through device memory).
    pub fn secret_params(&self) -> Vec<usize> {
        Vec::new()
    }
}

/// Every variant the library can launch.
pub fn shipped_variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for dtype in [DType::F16, DType::Bf16] {
        for head_dim in [64, 128] {
            for causal in [false, true] {
                for secret_len in [false, true] {
                    v.push(Variant {
                        dtype,
                        head_dim,
                        causal,
                        block_m: 128,
                        secret_len,
                    });
                }
                if head_dim == 64 && !causal {
                    v.push(Variant {
                        dtype,
                        head_dim,
                        causal,
                        block_m: 192,
                        secret_len: false,
                    });
                }
            }
        }
    }
    v
}
