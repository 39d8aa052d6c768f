//! The device a [`Context`] stands for: one CUDA device, its stream, the kernels loaded on it,
//! and its memory. The launch code needs this much of a context; the attention API
//! (`context.rs` and the other `impl Context` blocks) builds on it.

use crate::error::{Error, Result};
use crate::kernels::{
    KernelBuild, Variant, APPEND_SYMBOL, COMBINE_SYMBOL, FORWARD_SYMBOL, VARLEN_BUILD_SYMBOL,
    VARLEN_WORK_SYMBOL,
};
use crate::spec::DType;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    ValidAsZeroBits,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Element types the kernels take: 16-bit floats.
pub trait Element: DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(x: f64) -> Self {
        half::f16::from_f64(x)
    }
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::Bf16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(x: f64) -> Self {
        half::bf16::from_f64(x)
    }
}

/// Opens the driver library ourselves first: cudarc panics when it is missing, we return
/// `Error::NoDriver` instead.
pub(crate) fn probe_driver() -> Result<()> {
    static PROBE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: loading the driver library runs its initialisers, as cudarc would.
            match unsafe { libloading::Library::new("libcuda.so.1") } {
                Ok(lib) => {
                    std::mem::forget(lib);
                    Ok(())
                }
                Err(e) => Err(format!("cannot load libcuda.so.1 ({e})")),
            }
        })
        .clone()
        .map_err(Error::NoDriver)
}

/// A CUDA device with its stream and the flashcore kernels loaded on it.
pub struct Context {
    cuda: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Mutex<HashMap<KernelBuild, Arc<LoadedKernel>>>,
    num_sms: usize,
}

impl Context {
    /// Opens device `ordinal`. Errors (never panics) when there is no driver, no device, or the
    /// device is not an sm_90 Hopper GPU.
    pub fn new(ordinal: usize) -> Result<Context> {
        probe_driver()?;
        let count = CudaContext::device_count().map_err(|e| match e.0 {
            cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE => Error::NoDevice,
            _ => Error::Driver(e),
        })?;
        if count <= 0 {
            return Err(Error::NoDevice);
        }
        if ordinal >= count as usize {
            return Err(Error::invalid(
                "device",
                format!("ordinal {ordinal} but only {count} CUDA device(s) present"),
            ));
        }
        let cuda = CudaContext::new(ordinal)?;
        let (major, minor) = cuda.compute_capability()?;
        if (major, minor) != (9, 0) {
            return Err(Error::UnsupportedDevice {
                name: cuda.name().unwrap_or_default(),
                major,
                minor,
            });
        }
        // One stream, ordered by construction: cudarc's per-buffer event tracking is not needed.
        // SAFETY: flashcore uses buffers from one stream only.
        unsafe { cuda.disable_event_tracking() };
        let num_sms = cuda.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )? as usize;
        // A stream of our own (not the legacy default stream): CUDA graphs can capture it.
        let stream = cuda.new_stream()?;
        Ok(Context {
            cuda,
            stream,
            kernels: Mutex::new(HashMap::new()),
            num_sms,
        })
    }

    pub fn cuda(&self) -> &Arc<CudaContext> {
        &self.cuda
    }
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    pub fn device_name(&self) -> String {
        self.cuda.name().unwrap_or_else(|_| "unknown".into())
    }
    pub fn num_sms(&self) -> usize {
        self.num_sms
    }

    /// The loaded kernel for `variant`, compiling (through the disk cache) on first use.
    pub(crate) fn kernel(&self, build: impl Into<KernelBuild>) -> Result<Arc<LoadedKernel>> {
        let build = build.into();
        let mut map = self
            .kernels
            .lock()
            .map_err(|_| Error::Other("kernel cache lock poisoned".into()))?;
        if let Some(k) = map.get(&build) {
            return Ok(k.clone());
        }
        let k = Arc::new(LoadedKernel::load(&self.cuda, build)?);
        map.insert(build, k.clone());
        Ok(k)
    }

    /// Free and total device memory, in bytes.
    pub fn memory_info(&self) -> Result<(u128, u128)> {
        self.cuda.bind_to_thread()?;
        let (free, total) = cudarc::driver::result::mem_get_info()?;
        Ok((free as u128, total as u128))
    }

    /// A typed error, before trying, for an allocation larger than the free device memory.
    fn check_fits(&self, bytes: u128) -> Result<()> {
        let (free, total) = self.memory_info()?;
        if bytes > free {
            return Err(Error::DeviceMemory { bytes, free, total });
        }
        Ok(())
    }

    /// An out-of-memory driver error as [`Error::DeviceMemory`]; other errors as they are.
    fn memory_error(&self, e: cudarc::driver::DriverError, bytes: u128) -> Error {
        if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            let (free, total) = self.memory_info().unwrap_or((0, 0));
            Error::DeviceMemory { bytes, free, total }
        } else {
            Error::Driver(e)
        }
    }

    /// Copies a host slice to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        self.check_fits(std::mem::size_of_val(host) as u128)?;
        self.stream
            .clone_htod(host)
            .map_err(|e| self.memory_error(e, std::mem::size_of_val(host) as u128))
    }
    pub fn upload_f16(&self, host: &[half::f16]) -> Result<CudaSlice<half::f16>> {
        self.upload(host)
    }
    pub fn upload_bf16(&self, host: &[half::bf16]) -> Result<CudaSlice<half::bf16>> {
        self.upload(host)
    }
    /// A zero-filled device buffer of `len` elements.
    pub fn alloc<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        let bytes = len as u128 * std::mem::size_of::<T>() as u128;
        self.check_fits(bytes)?;
        self.stream
            .alloc_zeros::<T>(len)
            .map_err(|e| self.memory_error(e, bytes))
    }
    /// Copies a device buffer back (waits for the stream).
    pub fn download<T: DeviceRepr + Default + Clone>(&self, dev: &CudaSlice<T>) -> Result<Vec<T>> {
        Ok(self.stream.clone_dtoh(dev)?)
    }
    /// Fills a device buffer from a host slice of equal length.
    pub fn copy_to_device<T: DeviceRepr>(&self, host: &[T], dev: &mut CudaSlice<T>) -> Result<()> {
        if host.len() != dev.len() {
            return Err(Error::invalid(
                "host",
                format!("{} elements for a buffer of {}", host.len(), dev.len()),
            ));
        }
        Ok(self.stream.memcpy_htod(host, dev)?)
    }
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }
}

/// A variant's module and function on one context, with its shared-memory limit raised.
pub struct LoadedKernel {
    pub(crate) module: Arc<CudaModule>,
    pub(crate) function: CudaFunction,
    /// Decode variants' second kernel, which merges the split partials.
    pub(crate) combine: Option<CudaFunction>,
    /// KV-cache variants' append kernel (`flashcore_kv_append`).
    pub(crate) append: Option<CudaFunction>,
    /// Varlen variants' work-list builder (kernels/fc_varlen_build.cuh) and the device address
    /// of the module's `__constant__` work list.
    pub(crate) build: Option<(CudaFunction, u64)>,
    /// What was compiled: `variant` below, or a timing-test build of it.
    pub compiled: KernelBuild,
    pub variant: Variant,
    pub smem_bytes: usize,
}

impl LoadedKernel {
    pub fn load(ctx: &Arc<CudaContext>, compiled: KernelBuild) -> Result<LoadedKernel> {
        let variant = compiled.variant;
        let cubin = compiled.cubin()?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin))?;
        let function = module.load_function(FORWARD_SYMBOL)?;
        let combine = if variant.decode {
            Some(module.load_function(COMBINE_SYMBOL)?)
        } else {
            None
        };
        let append = if variant.is_kv_cache() {
            Some(module.load_function(APPEND_SYMBOL)?)
        } else {
            None
        };
        let build = if variant.varlen {
            let stream = ctx.default_stream();
            let work = module
                .get_global(VARLEN_WORK_SYMBOL, &stream)?
                .device_ptr(&stream)
                .0;
            Some((module.load_function(VARLEN_BUILD_SYMBOL)?, work))
        } else {
            None
        };
        let smem_bytes = variant.tile().smem_bytes(variant.head_dim);
        function.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem_bytes as i32,
        )?;
        Ok(LoadedKernel {
            module,
            function,
            combine,
            append,
            build,
            compiled,
            variant,
            smem_bytes,
        })
    }
}
