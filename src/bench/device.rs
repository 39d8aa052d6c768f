//! The GPU side of the harness: random input buffers, a [`Launcher`] over flashcore [`Plan`]s,
//! and [`CudaBackend`], which implements the timing loops' [`Backend`] with CUDA events and
//! graphs. Nothing here runs without a GPU; the CPU tests cover the pure helpers only.

use super::timing::Backend;
use crate::attention::{AttentionParams, Context, DType, Plan};
use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::sync::Arc;

/// Enqueues one attention call on buffer set `set` (on the stream the backend times).
pub trait Launcher {
    fn sets(&self) -> usize;
    fn launch(&mut self, set: usize) -> Result<()>;
}

impl Launcher for Box<dyn Launcher + '_> {
    fn sets(&self) -> usize {
        (**self).sets()
    }
    fn launch(&mut self, set: usize) -> Result<()> {
        (**self).launch(set)
    }
}

/// What the harness reads from the device once per run.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub name: String,
    /// `CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE`, bytes.
    pub l2_bytes: u64,
    pub num_sms: usize,
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub cuda_driver_version: Option<i32>,
}

pub fn device_info(ctx: &Context) -> Result<DeviceInfo> {
    let l2 = ctx
        .cuda()
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
    let mut v: std::ffi::c_int = 0;
    // SAFETY: the driver is loaded (Context::new succeeded); `v` outlives the call.
    let version = unsafe { sys::cuDriverGetVersion(&mut v) }
        .result()
        .ok()
        .map(|_| v);
    Ok(DeviceInfo {
        name: ctx.device_name(),
        l2_bytes: l2.max(0) as u64,
        num_sms: ctx.num_sms(),
        cuda_driver_version: version,
    })
}

/// Bytes of device memory free now.
pub fn free_bytes(ctx: &Context) -> Result<u64> {
    Ok(ctx.cuda().mem_get_info()?.0 as u64)
}

/// Bytes of one buffer set's inputs (q, k, v) and of the whole set (q, k, v, o).
pub fn set_bytes(p: &AttentionParams) -> (u64, u64) {
    let e = p.dtype.size() as u64;
    let inputs = (p.q_len() as u64 + 2 * p.kv_len() as u64) * e;
    (inputs, inputs + p.q_len() as u64 * e)
}

/// `len` random values uniform in [−1, 1), rounded to `dtype`, as raw 16-bit patterns.
/// Deterministic in `seed`; generated in parallel chunks.
pub fn random_bits(dtype: DType, len: usize, seed: u64) -> Vec<u16> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![0u16; len];
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(
                seed ^ (c as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            );
            for x in chunk.iter_mut() {
                let f: f32 = rng.random_range(-1.0f32..1.0);
                *x = match dtype {
                    DType::F16 => half::f16::from_f32(f).to_bits(),
                    DType::Bf16 => half::bf16::from_f32(f).to_bits(),
                };
            }
        });
    out
}

struct BufferSet {
    _q: CudaSlice<u16>,
    _k: CudaSlice<u16>,
    _v: CudaSlice<u16>,
    _o: CudaSlice<u16>,
    ptrs: [u64; 4],
}

/// `sets` buffer sets of random q, k, v (uploaded once) and an output each, with one [`Plan`]
/// per set: a plan caches the kernel parameter block (tensor maps) of the last pointers it saw,
/// so one plan per set keeps every timed launch free of host-side re-encoding.
pub struct PlanLauncher {
    plans: Vec<Plan>,
    sets: Vec<BufferSet>,
}

impl PlanLauncher {
    pub fn new(ctx: &Context, params: &AttentionParams, sets: usize, seed: u64) -> Result<Self> {
        let stream = ctx.stream();
        let mut bufs = Vec::with_capacity(sets);
        let mut plans = Vec::with_capacity(sets);
        for s in 0..sets.max(1) {
            let base = seed.wrapping_add((s as u64) << 8);
            let q = stream.clone_htod(&random_bits(params.dtype, params.q_len(), base))?;
            let k = stream.clone_htod(&random_bits(params.dtype, params.kv_len(), base + 1))?;
            let v = stream.clone_htod(&random_bits(params.dtype, params.kv_len(), base + 2))?;
            let o = stream.alloc_zeros::<u16>(params.q_len())?;
            let ptrs = {
                let (qp, _g1) = q.device_ptr(stream);
                let (kp, _g2) = k.device_ptr(stream);
                let (vp, _g3) = v.device_ptr(stream);
                let (op, _g4) = o.device_ptr(stream);
                [qp, kp, vp, op]
            };
            bufs.push(BufferSet {
                _q: q,
                _k: k,
                _v: v,
                _o: o,
                ptrs,
            });
            plans.push(ctx.plan(params)?);
        }
        stream.synchronize()?;
        Ok(PlanLauncher { plans, sets: bufs })
    }
}

impl Launcher for PlanLauncher {
    fn sets(&self) -> usize {
        self.sets.len()
    }
    fn launch(&mut self, set: usize) -> Result<()> {
        let [q, k, v, o] = self.sets[set].ptrs;
        // SAFETY: the buffers were allocated for exactly this plan's shape and dtype (q_len /
        // kv_len elements of 16 bits, cudarc allocations are 256-byte aligned), live as long as
        // `self`, and every use is on the context's one stream.
        unsafe { self.plans[set].launch_raw(q, k, v, o, 0) }
    }
}

/// [`Backend`] over CUDA: events with timing enabled as marks, stream capture for graphs.
pub struct CudaBackend<L: Launcher> {
    launcher: L,
    stream: Arc<CudaStream>,
    events: Vec<CudaEvent>,
    graphs: Vec<CudaGraph>,
}

impl<L: Launcher> CudaBackend<L> {
    /// `stream` must be the stream `launcher` enqueues on.
    pub fn new(launcher: L, stream: Arc<CudaStream>) -> Self {
        CudaBackend {
            launcher,
            stream,
            events: Vec::new(),
            graphs: Vec::new(),
        }
    }

    /// Drops the captured graphs (before the buffers they point into go away).
    pub fn clear_graphs(&mut self) {
        self.graphs.clear();
    }
}

impl<L: Launcher> Backend for CudaBackend<L> {
    fn sets(&self) -> usize {
        self.launcher.sets()
    }
    fn launch(&mut self, set: usize) -> Result<()> {
        self.launcher.launch(set)
    }
    fn mark(&mut self, slot: usize) -> Result<()> {
        while self.events.len() <= slot {
            let ev = self
                .stream
                .context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            self.events.push(ev);
        }
        Ok(self.events[slot].record(&self.stream)?)
    }
    fn sync(&mut self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }
    fn elapsed_ms(&mut self, start: usize, end: usize) -> Result<f64> {
        let (a, b) = match (self.events.get(start), self.events.get(end)) {
            (Some(a), Some(b)) => (a, b),
            _ => {
                return Err(Error::Other(format!(
                    "timing slots {start}/{end} never recorded"
                )))
            }
        };
        Ok(a.elapsed_ms(b)? as f64)
    }
    fn capture(&mut self, sets: &[usize]) -> Result<usize> {
        if self.stream.cu_stream().is_null() {
            return Err(Error::Other(
                "graph replay needs a capturable stream, but the context launches on the legacy \
                 default stream (CUDA cannot capture it); per-call timing still works"
                    .into(),
            ));
        }
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        for &s in sets {
            if let Err(e) = self.launcher.launch(s) {
                // End the capture so the stream is usable again; the partial graph is dropped.
                let _ = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
                return Err(e);
            }
        }
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))?
            .ok_or_else(|| Error::Other("stream capture produced no graph".into()))?;
        graph.upload()?;
        self.graphs.push(graph);
        Ok(self.graphs.len() - 1)
    }
    fn replay(&mut self, graph: usize) -> Result<()> {
        match self.graphs.get(graph) {
            Some(g) => Ok(g.launch()?),
            None => Err(Error::Other(format!("no captured graph #{graph}"))),
        }
    }
}

impl<L: Launcher> Drop for CudaBackend<L> {
    fn drop(&mut self) {
        // Graphs first, while the buffers their kernels point into are still alive.
        self.graphs.clear();
    }
}
