//! The public attention API: parameters, validation, context, launch.

pub mod backward;
pub mod backward_external;
pub mod chunked;
pub mod context;
pub mod decode;
pub mod external;
pub mod kv_append;
pub mod launch;
pub mod params;
pub mod tensor_map;
pub mod validate;
pub mod varlen_secret;

pub use context::{Context, Element, KvCache};
pub use decode::Pages;
pub use launch::Plan;
pub use params::{AttentionParams, DType, Layout, Window};
