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
pub const HEADERS: &[(&str, &str)] =
    &[("fc_common.cuh", include_str!("../../kernels/fc_common.cuh"))];

fn headers() -> Vec<Header<'static>> {
    HEADERS
        .iter()
        .map(|(name, source)| Header { name, source })
        .collect()
}

/// One compiled specialisation of the forward kernel. Everything that distinguishes variants
/// is public (DESIGN.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Variant {
    pub dtype: DType,
    pub head_dim: usize,
    pub causal: bool,
}

impl Variant {
    /// A stable, human-readable name, e.g. `fwd_bf16_d128_causal`.
    pub fn name(&self) -> String {
        format!(
            "fwd_{}_d{}_{}",
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
                v.push(Variant {
                    dtype,
                    head_dim,
                    causal,
                });
            }
        }
    }
    v
}
