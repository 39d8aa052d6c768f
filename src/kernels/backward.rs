//! The backward kernels (`kernels/attention_bwd.cu`, issue 23) and the variants they are compiled
//! into: a type of their own, beside the forward's [`super::Variant`], so the two evolve apart.
//! One cubin per variant holds the three kernels of a backward pass (preprocess, dK/dV, dQ).

use crate::attention::params::DType;
use crate::error::Result;
use crate::jit::{self, Header};

/// Symbols of the three backward kernels, in launch order.
pub const PREPROCESS_SYMBOL: &str = "flashcore_bwd_preprocess";
pub const DKDV_SYMBOL: &str = "flashcore_bwd_dkdv";
pub const DQ_SYMBOL: &str = "flashcore_bwd_dq";
/// Every backward kernel symbol; the GEMM kernels (the last two) must use wgmma.
pub const SYMBOLS: [&str; 3] = [PREPROCESS_SYMBOL, DKDV_SYMBOL, DQ_SYMBOL];

const SOURCE: &str = include_str!("../../kernels/attention_bwd.cu");

/// The backward's own headers plus the forward headers it includes (read-only for it).
pub const HEADERS: &[(&str, &str)] = embed_headers!(
    "fc_common.cuh",
    "fc_mbarrier.cuh",
    "fc_tma.cuh",
    "fc_wgmma.cuh",
    "fc_wgmma_ops.cuh",
    "fc_bwd_config.cuh",
    "fc_bwd_preprocess.cuh",
    "fc_bwd_dkdv.cuh",
    "fc_bwd_dq.cuh",
);

/// Tile constants of `kernels/fc_bwd_config.cuh` (namespace `bw`), mirrored for the host.
pub const KV_BLOCK_N: usize = 128;
pub const KV_BLOCK_M: usize = 64;
pub const KV_STAGES: usize = 2;
pub const Q_BLOCK_M: usize = 128;
pub const Q_BLOCK_N: usize = 64;
pub const Q_STAGES: usize = 2;
/// Query rows per (batch, head) of the preprocess workspace are padded to a multiple of this.
pub const ROW_PAD: usize = 128;
/// Threads of the GEMM kernels (a producer warpgroup and two consumers) and of the preprocess.
pub const GEMM_THREADS: u32 = 384;
pub const PREPROCESS_THREADS: u32 = 256;
/// Query rows per preprocess block (one warp each).
pub const PREPROCESS_ROWS: usize = 8;

/// One compiled specialisation of the backward. Everything that distinguishes variants is public.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BwdVariant {
    pub dtype: DType,
    pub head_dim: usize,
    pub causal: bool,
}

impl BwdVariant {
    /// A stable, human-readable name, e.g. `bwd_bf16_d128_causal`.
    pub fn name(&self) -> String {
        format!(
            "bwd_{}_d{}_{}",
            self.dtype.name(),
            self.head_dim,
            if self.causal { "causal" } else { "full" }
        )
    }

    pub fn options(&self) -> Vec<String> {
        let mut o = jit::base_options();
        o.push(format!("-DFC_HEAD_DIM={}", self.head_dim));
        o.push(format!("-DFC_BF16={}", (self.dtype == DType::Bf16) as u8));
        o.push(format!("-DFC_CAUSAL={}", self.causal as u8));
        o
    }

    /// The cubin (all three kernels), through the on-disk cache. Needs NVRTC, not a GPU.
    pub fn cubin(&self) -> Result<Vec<u8>> {
        let headers: Vec<Header<'static>> = HEADERS
            .iter()
            .map(|(name, source)| Header { name, source })
            .collect();
        jit::compile_cached(&self.name(), SOURCE, &headers, &self.options())
    }

    /// Dynamic shared memory of the dK/dV kernel: K and V blocks, the (Q, dO) ring, mbarriers,
    /// plus 1 KiB of alignment slack.
    pub fn dkdv_smem_bytes(&self) -> usize {
        let d = self.head_dim;
        2 * KV_BLOCK_N * d * 2 + 2 * KV_STAGES * KV_BLOCK_M * d * 2 + (1 + 2 * KV_STAGES) * 8 + 1024
    }

    /// Dynamic shared memory of the dQ kernel: Q and dO tiles, the (K, V) ring, mbarriers, slack.
    pub fn dq_smem_bytes(&self) -> usize {
        let d = self.head_dim;
        2 * Q_BLOCK_M * d * 2 + 2 * Q_STAGES * Q_BLOCK_N * d * 2 + (1 + 2 * Q_STAGES) * 8 + 1024
    }

    /// Ordinals of kernel parameters that hold secrets (none: Q, K, V, O, dO and the LSE reach
    /// the kernels only through device memory, which the audit treats as secret).
    pub fn secret_params(&self) -> Vec<usize> {
        Vec::new()
    }
}

/// Every backward variant the library can launch.
pub fn shipped_bwd_variants() -> Vec<BwdVariant> {
    let mut v = Vec::new();
    for dtype in [DType::F16, DType::Bf16] {
        for head_dim in [64, 128] {
            for causal in [false, true] {
                v.push(BwdVariant {
                    dtype,
                    head_dim,
                    causal,
                });
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_fits_and_names_are_distinct() {
        let vs = shipped_bwd_variants();
        assert_eq!(vs.len(), 8);
        let names: std::collections::HashSet<String> = vs.iter().map(|v| v.name()).collect();
        assert_eq!(names.len(), vs.len());
        for v in &vs {
            assert!(
                v.dkdv_smem_bytes() <= super::super::MAX_SMEM_BYTES,
                "{}",
                v.name()
            );
            assert!(
                v.dq_smem_bytes() <= super::super::MAX_SMEM_BYTES,
                "{}",
                v.name()
            );
        }
    }
}
