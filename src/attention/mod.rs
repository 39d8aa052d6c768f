//! The public attention API: parameters, validation, launch.

pub mod params;
pub mod validate;

pub use params::{AttentionParams, DType, Layout};
