//! The public attention API: parameters, validation, context, launch.

pub mod backward;
pub mod backward_external;
pub mod call;
pub mod chunked;
pub mod context;
pub mod decode;
pub mod device;
pub mod external;
pub mod kv_append;
pub mod launch;
pub mod tensor_map;
pub mod validate;
pub mod varlen_secret;

pub use call::{BackwardCall, Call, Grads, Keys, KvCache};
pub use context::{Context, Element};
pub use launch::Plan;
// What a call is lives in `spec`; re-exported here, where callers have always found it.
pub use crate::spec::params;
pub use crate::spec::{AttentionParams, DType, Layout, Pages, Window};
