//! One error type for the whole crate: every failure a user can cause or meet is a variant
//! with a message that names the argument and the rule, never a panic.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A user-supplied argument broke a rule; raised before any launch.
    #[error("invalid argument `{arg}`: {rule}")]
    InvalidArgument { arg: &'static str, rule: String },

    #[error("no CUDA driver: {0} (a GPU machine with the NVIDIA driver is needed for this; compilation and audit work without one; `flashcore attn --cpu` runs the float64 reference instead)")]
    NoDriver(String),

    #[error("no CUDA device found (`flashcore attn --cpu` runs the float64 reference instead)")]
    NoDevice,

    #[error("unsupported device `{name}` (compute capability {major}.{minor}): flashcore's kernels need sm_90 (H100/H200); `flashcore attn --cpu` runs the float64 reference instead")]
    UnsupportedDevice {
        name: String,
        major: i32,
        minor: i32,
    },

    #[error("NVRTC not found: {0}. Run `bash scripts/install-cuda-tools.sh` (installs the pinned PyPI wheels into .cuda-tools/) or set CUDA_HOME")]
    NoNvrtc(String),

    #[error("tool `{tool}` not found: {hint}")]
    ToolMissing { tool: &'static str, hint: String },

    #[error("tool `{tool}` failed: {message}")]
    ToolFailed { tool: String, message: String },

    /// An external tool (nvdisasm, cuobjdump) ran past its wall-clock limit and was killed.
    #[error("tool `{tool}` ({path}) did not finish within its {limit_s} s limit and was stopped (a malformed input can make it run forever); set {env}=SECONDS to allow longer")]
    ToolTimeout {
        tool: &'static str,
        path: String,
        limit_s: f64,
        env: &'static str,
    },

    #[error("NVRTC could not compile `{kernel}`:\n{log}")]
    Compile { kernel: String, log: String },

    #[error("out of device memory: {bytes} bytes needed, {free} free of {total} on this device; use a smaller batch or sequence length")]
    DeviceMemory {
        bytes: u128,
        free: u128,
        total: u128,
    },

    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),

    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("bad tensor file: {0}")]
    TensorFile(String),

    #[error("{0}")]
    Other(String),
}

impl Error {
    pub(crate) fn invalid(arg: &'static str, rule: impl Into<String>) -> Self {
        Error::InvalidArgument {
            arg,
            rule: rule.into(),
        }
    }
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
