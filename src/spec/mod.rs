//! What a call is, independent of how it runs: its parameters (shapes, dtype, layout, mask,
//! scale), how its buffers sit in memory, and the limits the shipped kernels accept. The lowest
//! layer of the library: it imports nothing else from the crate.

pub mod buffers;
pub mod limits;
pub mod params;

pub use buffers::{DeviceTensor, Lengths, Pages, Strides, MIN_PAGE_SIZE, TMA_PAGE_SIZE};
pub use limits::{BACKWARD_HEAD_DIMS, MAX_SEQLEN_Q, SUPPORTED_HEAD_DIMS, TENSOR_ALIGN};
pub use params::{AttentionParams, DType, Layout, Window};
