//! flashcore: data-oblivious fused attention for NVIDIA Hopper.

pub mod abi;
pub mod attention;
pub mod audit;
pub mod bench;
pub mod cli;
pub mod error;
pub mod jit;
pub mod kernels;
pub mod knobs;
pub mod leakage;
pub mod output;
pub mod reference;
pub mod shipped;
pub mod spec;
pub mod tensor_io;
pub mod tensor_io_kv;

pub use attention::{AttentionParams, DType, Layout};
pub use error::{Error, Result};
