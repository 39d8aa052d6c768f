//! The two device-side helpers of the measurement loop:
//!
//! * [`Spin`]: the queued-timing wait (`kernels/fc_spin.cu`). Enqueued in front of each timed
//!   launch, one thread spins on the global timer while the host enqueues the start event and
//!   the kernel; when the spin ends the kernel is already queued, so the event interval holds
//!   the kernel alone rather than the host's launch latency (~3 µs, and its jitter).
//! * [`CycleTimer`]: the buffer the cycle-timer build writes its records to
//!   ([`super::cycles`]), and the two `__constant__` words that tell it where: the buffer's
//!   address (set once) and the launch's slot in it (copied device-to-device before each
//!   launch, outside the event interval).

use super::cycles::{self, LaunchCycles, WORDS};
use crate::attention::{Context, Plan};
use crate::error::{Error, Result};
use cudarc::driver::{result, CudaFunction, CudaModule, CudaSlice, DevicePtr};
use std::sync::Arc;

/// The queued-timing wait kernel, loaded on a context.
pub struct Spin {
    _module: Arc<CudaModule>,
    function: CudaFunction,
}

impl Spin {
    pub fn load(ctx: &Context) -> Result<Spin> {
        let cubin = crate::kernels::spin_cubin()?;
        let module = ctx
            .cuda()
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))?;
        let function = module.load_function(crate::kernels::SPIN_SYMBOL)?;
        Ok(Spin {
            _module: module,
            function,
        })
    }

    /// Enqueues a wait of `ns` nanoseconds on the context's stream.
    pub fn enqueue(&self, ctx: &Context, ns: u64) -> Result<()> {
        let mut arg = ns;
        let mut args = [&mut arg as *mut u64 as *mut std::ffi::c_void];
        // SAFETY: the kernel takes one u64 by value; `args` points at it for the call.
        unsafe {
            result::launch_kernel(
                self.function.cu_function(),
                (1, 1, 1),
                (1, 1, 1),
                0,
                ctx.stream().cu_stream(),
                &mut args,
            )?;
        }
        Ok(())
    }
}

/// Where the cycle-timer build of one plan set writes, and how its records are read back.
pub struct CycleTimer {
    records: CudaSlice<u64>,
    /// 0, 1, …, batch − 1: the source of each launch's slot index.
    indices: CudaSlice<u32>,
    /// Device address of the module's `fc_timer_slot`.
    slot_addr: u64,
    ctas: usize,
    warps: usize,
    host: Vec<u64>,
}

impl CycleTimer {
    /// Records for `batch` launches of `plan` (a cycle-timer build); points the module's
    /// `fc_timer_buf` at them.
    pub fn new(ctx: &Context, plan: &Plan, batch: usize) -> Result<CycleTimer> {
        let variant = plan.variant();
        if !plan.compiled().test.cycle_timer {
            return Err(Error::Other(format!(
                "{} is not a cycle-timer build",
                plan.compiled().name()
            )));
        }
        let ctas = plan.ctas() as usize;
        let warps = 4 * variant.tile().consumers;
        if warps > cycles::MAX_WARPS {
            return Err(Error::Other(format!(
                "{} consumer warps, the cycle timer's record holds {}",
                warps,
                cycles::MAX_WARPS
            )));
        }
        let records = ctx.alloc::<u64>(batch * ctas * WORDS)?;
        let idx: Vec<u32> = (0..batch as u32).collect();
        let indices = ctx.upload(&idx)?;
        let global = |name: &str| {
            plan.module_global(name).map_err(|e| {
                Error::Other(format!(
                    "cycle timer: cannot find `{name}` in {} ({e}); --no-cycles measures without it",
                    variant.name()
                ))
            })
        };
        let (buf_addr, buf_len) = global("fc_timer_buf")?;
        let (slot_addr, slot_len) = global("fc_timer_slot")?;
        if buf_len != 8 || slot_len != 4 {
            return Err(Error::Other(format!(
                "cycle timer globals have {buf_len} and {slot_len} bytes, expected 8 and 4"
            )));
        }
        let base = records.device_ptr(ctx.stream()).0;
        ctx.synchronize()?;
        // SAFETY: `buf_addr` is the module's 8-byte `fc_timer_buf`; the copy is synchronous.
        unsafe { result::memcpy_htod_sync(buf_addr, &[base])? };
        Ok(CycleTimer {
            records,
            indices,
            slot_addr,
            ctas,
            warps,
            host: vec![0; batch * ctas * WORDS],
        })
    }

    /// The raw record words read by the last [`CycleTimer::read`] (`ctas` records of
    /// [`super::cycles::WORDS`] per launch), for the phase breakdown of `flashcore bench --phases`.
    pub fn words(&self) -> &[u64] {
        &self.host
    }

    /// CTAs per launch (records per launch).
    pub fn ctas(&self) -> usize {
        self.ctas
    }

    /// Zeroes the records of the next `b` launches (stream-ordered, before the batch).
    pub fn clear(&self, ctx: &Context, b: usize) -> Result<()> {
        let base = self.records.device_ptr(ctx.stream()).0;
        // SAFETY: the range lies inside `records` (b ≤ batch), on the context's stream.
        unsafe {
            result::memset_d8_async(base, 0, b * self.ctas * WORDS * 8, ctx.stream().cu_stream())?
        };
        Ok(())
    }

    /// Makes the next launch write slot `t` (stream-ordered, before its start event).
    pub fn select(&self, ctx: &Context, t: usize) -> Result<()> {
        let src = self.indices.device_ptr(ctx.stream()).0 + 4 * t as u64;
        // SAFETY: `t` < batch indexes `indices`; `slot_addr` is the module's 4-byte word.
        unsafe { result::memcpy_dtod_async(self.slot_addr, src, 4, ctx.stream().cu_stream())? };
        Ok(())
    }

    /// After the stream synchronised: the first `b` launches' records, reduced.
    pub fn read(&mut self, ctx: &Context, b: usize) -> Result<Vec<LaunchCycles>> {
        let n = b * self.ctas * WORDS;
        ctx.stream()
            .memcpy_dtoh(&self.records.slice(0..n), &mut self.host[..n])?;
        ctx.synchronize()?;
        self.host[..n]
            .chunks_exact(self.ctas * WORDS)
            .enumerate()
            .map(|(t, w)| {
                cycles::reduce(w, self.ctas, self.warps)
                    .map_err(|e| Error::Other(format!("cycle timer, launch {t} of the batch: {e}")))
            })
            .collect()
    }
}
