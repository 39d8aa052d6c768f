//! flashcore: data-oblivious fused attention for NVIDIA Hopper.
//!
//! The `tools` feature (on by default) adds what the `flashcore` binary is made of: [`cli`],
//! [`bench`], [`leakage`] and the tensor files they read and write. Nothing else imports them.

pub mod abi;
pub mod attention;
pub mod audit;
#[cfg(feature = "tools")]
pub mod bench;
#[cfg(feature = "tools")]
pub mod cli;
pub mod error;
pub mod jit;
pub mod kernels;
pub mod knobs;
#[cfg(feature = "tools")]
pub mod leakage;
#[cfg(feature = "tools")]
pub mod output;
pub mod reference;
pub mod shipped;
pub mod spec;
#[cfg(feature = "tools")]
pub mod tensor_io;
#[cfg(feature = "tools")]
pub mod tensor_io_kv;

pub use attention::{AttentionParams, DType, Layout};
pub use error::{Error, Result};
