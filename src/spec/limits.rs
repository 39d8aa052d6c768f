//! Limits of what the shipped kernels take: head dims, decode's query positions, alignment.

/// Head dimensions the shipped forward kernels are built for (96: Phi-3; 256: Gemma 2).
pub const SUPPORTED_HEAD_DIMS: [usize; 4] = [64, 96, 128, 256];

/// Head dimensions the backward kernels are built for (every forward head dim).
pub const BACKWARD_HEAD_DIMS: [usize; 4] = [64, 96, 128, 256];

/// `64, 96, 128, 256`: a list of head dims as messages and docs write it.
pub fn head_dim_list(dims: &[usize]) -> String {
    dims.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Calls with at most this many query positions per sequence run in decode mode.
pub const MAX_SEQLEN_Q: usize = 16;

/// TMA addresses rows in 16-byte units: the base-address alignment it needs for Q, K and V.
pub const TENSOR_ALIGN: usize = 16;
