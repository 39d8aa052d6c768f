//! The candle ops: device pointers of candle's CUDA storages (through cudarc's event tracking,
//! so candle's own ordering rules hold), a flashcore `ExternalContext` per device sharing the
//! primary context, launches on candle's stream for the device.

use crate::check::{err, from_flashcore, DenseSpec, KvCacheSpec, VarlenSpec, POISON};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice};
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Storage, Tensor};
use flashcore::attention::external::ExternalContext;
use flashcore::attention::DType;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

/// One flashcore context per device ordinal, for the life of the process (candle keeps the same
/// primary context alive).
fn context(stream: &CudaStream) -> Result<Arc<ExternalContext>> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<ExternalContext>>>> = OnceLock::new();
    let ordinal = stream.context().ordinal();
    let mut map = CONTEXTS
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| err("context lock poisoned"))?;
    if let Some(c) = map.get(&ordinal) {
        return Ok(c.clone());
    }
    let c = Arc::new(ExternalContext::new(ordinal).map_err(from_flashcore)?);
    map.insert(ordinal, c.clone());
    Ok(c)
}

/// The storage's base address for reading on `stream` (waits for its last write there).
fn ptr<'a>(s: &'a CudaStorage, stream: &'a CudaStream) -> Result<(u64, SyncOnDrop<'a>)> {
    Ok(match &s.slice {
        CudaStorageSlice::F16(x) => x.device_ptr(stream),
        CudaStorageSlice::BF16(x) => x.device_ptr(stream),
        CudaStorageSlice::U32(x) => x.device_ptr(stream),
        CudaStorageSlice::I32(x) => x.device_ptr(stream),
        _ => return Err(err(format!("unexpected storage dtype {:?}", s.dtype()))),
    })
}

fn ptr_mut<'a>(s: &'a mut CudaStorage, stream: &'a CudaStream) -> Result<(u64, SyncOnDrop<'a>)> {
    Ok(match &mut s.slice {
        CudaStorageSlice::F16(x) => x.device_ptr_mut(stream),
        CudaStorageSlice::BF16(x) => x.device_ptr_mut(stream),
        _ => return Err(err("output storage is not f16/bf16")),
    })
}

/// An uninitialised output of `n` elements on candle's stream.
fn alloc_out(dev: &CudaDevice, dtype: DType, n: usize) -> Result<CudaStorage> {
    // SAFETY: every element is written by the kernel before candle can read it (the poison
    // option checks that in tests).
    Ok(match dtype {
        DType::F16 => {
            CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::f16>(n)? }, dev.clone())
        }
        DType::Bf16 => {
            CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(n)? }, dev.clone())
        }
    })
}

/// Fills `bytes` bytes at `ptr` with 0xFF (NaN in f16 and bf16) on `stream`, when poisoning.
fn maybe_poison(ptr: u64, bytes: usize, stream: &CudaStream) -> Result<()> {
    if POISON.load(Ordering::Relaxed) {
        // SAFETY: `ptr` is a live allocation of at least `bytes` bytes on this stream's device.
        unsafe {
            candle_core::cuda_backend::cudarc::driver::result::memset_d8_async(
                ptr,
                0xFF,
                bytes,
                stream.cu_stream(),
            )
        }
        .map_err(err)?;
    }
    Ok(())
}

/// A scratch buffer of `bytes` (none for 0), freed in stream order after the launches.
fn scratch(
    dev: &CudaDevice,
    bytes: usize,
) -> Result<Option<candle_core::cuda_backend::cudarc::driver::CudaSlice<u8>>> {
    if bytes == 0 {
        return Ok(None);
    }
    // SAFETY: scratch the kernels write before they read.
    Ok(Some(unsafe { dev.alloc::<u8>(bytes)? }))
}

/// The CUDA storage of a tensor an op holds (cu_seqlens, cache_seqlens, block table, new rows).
fn cuda_of<'a>(name: &str, s: &'a Storage) -> Result<&'a CudaStorage> {
    match s {
        Storage::Cuda(cs) => Ok(cs),
        _ => Err(err(format!("{name} is not on the CUDA device"))),
    }
}

fn cpu_only(name: &str) -> candle_core::Error {
    err(format!(
        "{name}: no CPU implementation (flashcore runs on CUDA tensors of an sm_90 GPU)"
    ))
}

pub(crate) struct Dense(pub DenseSpec);

impl CustomOp3 for Dense {
    fn name(&self) -> &'static str {
        "flashcore-attn"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Err(cpu_only(self.name()))
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        ql: &Layout,
        k: &CudaStorage,
        kl: &Layout,
        v: &CudaStorage,
        vl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let p = &self.0.params;
        let dev = &q.device;
        let stream = dev.cuda_stream();
        let ctx = context(&stream)?;
        let mut out = alloc_out(dev, p.dtype, p.q_len())?;
        let mut ws = scratch(dev, self.0.workspace_bytes())?;
        {
            let (qp, _q) = ptr(q, &stream)?;
            let (kp, _k) = ptr(k, &stream)?;
            let (vp, _v) = ptr(v, &stream)?;
            let (op, _o) = ptr_mut(&mut out, &stream)?;
            let (wp, _w) = match ws.as_mut() {
                Some(w) => {
                    let (p, g) = w.device_ptr_mut(&stream);
                    (p, Some(g))
                }
                None => (0, None),
            };
            maybe_poison(op, p.q_len() * 2, &stream)?;
            let call = self.0.call([ql, kl, vl], [qp, kp, vp, op, wp]);
            // SAFETY: the pointers are live candle storages on this device that cover what the
            // layouts reach (candle checked each layout against its storage; flashcore checks
            // the strides), kept alive by candle until the op returns and by the stream order
            // after; `out` is a fresh allocation that aliases nothing.
            unsafe { ctx.attention(&call, stream.cu_stream()) }.map_err(from_flashcore)?;
        }
        drop(ws);
        let shape = Shape::from((p.batch, p.seqlen_q, p.heads_q, p.head_dim));
        Ok((out, shape))
    }
}

pub(crate) struct Varlen {
    pub spec: VarlenSpec,
    pub seqlens_q: Tensor,
    pub seqlens_k: Tensor,
}

impl CustomOp3 for Varlen {
    fn name(&self) -> &'static str {
        "flashcore-attn-varlen"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Err(cpu_only(self.name()))
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        ql: &Layout,
        k: &CudaStorage,
        kl: &Layout,
        v: &CudaStorage,
        vl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let s = &self.spec;
        let p = &s.params;
        let dev = &q.device;
        let stream = dev.cuda_stream();
        let ctx = context(&stream)?;
        let n = s.total_q * p.heads_q * p.head_dim;
        let mut out = alloc_out(dev, p.dtype, n.max(1))?;
        let mut ws = scratch(dev, s.workspace_bytes())?;
        {
            let (qp, _q) = ptr(q, &stream)?;
            let (kp, _k) = ptr(k, &stream)?;
            let (vp, _v) = ptr(v, &stream)?;
            let (op, _o) = ptr_mut(&mut out, &stream)?;
            let (wp, _w) = match ws.as_mut() {
                Some(w) => {
                    let (p, g) = w.device_ptr_mut(&stream);
                    (p, Some(g))
                }
                None => (0, None),
            };
            let (sqs, sql) = self.seqlens_q.storage_and_layout();
            let (sks, skl) = self.seqlens_k.storage_and_layout();
            let (sq, _sq) = ptr(cuda_of("seqlens_q", &sqs)?, &stream)?;
            let (sk, _sk) = ptr(cuda_of("seqlens_k", &sks)?, &stream)?;
            let (sq, sk) = (
                sq + 4 * sql.start_offset() as u64,
                sk + 4 * skl.start_offset() as u64,
            );
            maybe_poison(op, n * 2, &stream)?;
            let call = s.call([ql, kl, vl], [qp, kp, vp, op, wp], [sq, sk]);
            // SAFETY: as for `Dense`; the cumulative lengths are u32/i32 `[batch + 1]` device
            // tensors (u32 values below 2^31 read the same as i32), the workspace is ours.
            unsafe { ctx.attention_varlen(&call, stream.cu_stream()) }.map_err(from_flashcore)?;
        }
        drop(ws);
        let shape = Shape::from((s.total_q, p.heads_q, p.head_dim));
        Ok((out, shape))
    }
}

pub(crate) struct KvCacheOp {
    pub spec: KvCacheSpec,
    pub new: Option<(Tensor, Tensor)>,
    pub cache_seqlens: Tensor,
    pub block_table: Option<Tensor>,
}

impl CustomOp3 for KvCacheOp {
    fn name(&self) -> &'static str {
        "flashcore-attn-kvcache"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Err(cpu_only(self.name()))
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        ql: &Layout,
        kc: &CudaStorage,
        kcl: &Layout,
        vc: &CudaStorage,
        vcl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let s = &self.spec;
        let p = &s.params;
        let dev = &q.device;
        let stream = dev.cuda_stream();
        let ctx = context(&stream)?;
        let mut out = alloc_out(dev, p.dtype, p.q_len())?;
        let mut ws = scratch(dev, s.workspace_bytes())?;
        let mut counts = match self.new {
            Some(_) => Some(unsafe { dev.alloc::<i32>(p.batch)? }),
            None => None,
        };
        {
            let (qp, _q) = ptr(q, &stream)?;
            let (kp, _k) = ptr(kc, &stream)?;
            let (vp, _v) = ptr(vc, &stream)?;
            let (op, _o) = ptr_mut(&mut out, &stream)?;
            let (wp, _w) = match ws.as_mut() {
                Some(w) => {
                    let (p, g) = w.device_ptr_mut(&stream);
                    (p, Some(g))
                }
                None => (0, None),
            };
            let (cp, _c) = match counts.as_mut() {
                Some(c) => {
                    let (p, g) = c.device_ptr_mut(&stream);
                    (p, Some(g))
                }
                None => (0, None),
            };
            let (ls, ll) = self.cache_seqlens.storage_and_layout();
            let (lp, _l) = ptr(cuda_of("cache_seqlens", &ls)?, &stream)?;
            let lp = lp + 4 * ll.start_offset() as u64;
            let table = self.block_table.as_ref().map(|t| t.storage_and_layout());
            let (tp, _t) = match &table {
                Some((ts, tl)) => {
                    let (p, g) = ptr(cuda_of("block_table", ts)?, &stream)?;
                    (p + 4 * tl.start_offset() as u64, Some(g))
                }
                None => (0, None),
            };
            // The new rows: storages held (read-locked) until the launch is enqueued.
            let new_st = self
                .new
                .as_ref()
                .map(|(k, v)| (k.storage_and_layout(), v.storage_and_layout()));
            let mut new_ptrs = None;
            let mut _new_sync = Vec::new();
            if let Some(((ks, kl), (vs, vl))) = &new_st {
                let (knp, g1) = ptr(cuda_of("k", ks)?, &stream)?;
                let (vnp, g2) = ptr(cuda_of("v", vs)?, &stream)?;
                _new_sync.extend([g1, g2]);
                new_ptrs = Some([(*kl, knp), (*vl, vnp)]);
            }
            maybe_poison(op, p.q_len() * 2, &stream)?;
            let call = s.call([ql, kcl, vcl], [qp, kp, vp, op, wp], [lp, tp, cp], new_ptrs);
            // SAFETY: as for `Dense`; the caches are written in place by the append (the
            // documented contract of `flash_attn_with_kvcache`), the counts, block table and
            // workspace are device tensors of the sizes flashcore needs.
            unsafe { ctx.attention(&call, stream.cu_stream()) }.map_err(from_flashcore)?;
        }
        drop(ws);
        drop(counts);
        let shape = Shape::from((p.batch, p.seqlen_q, p.heads_q, p.head_dim));
        Ok((out, shape))
    }
}
