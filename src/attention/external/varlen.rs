//! Varlen prefill on caller-owned memory and streams: packed `[total, heads, dim]`
//! tensors, `cu_seqlens` (and `seqused_k`) as device arrays, the work list built on the device
//! ([`crate::attention::launch::varlen::launch_device_list`]): no host synchronisation, so the
//! call runs inside CUDA graphs and `torch.compile(fullgraph=True)`.
//!
//! **One work list per stream.** The list lives in the kernel module's `__constant__` memory,
//! which each launch's copy overwrites; two streams launching varlen at the same time on one
//! module would race on it. So each stream (the per-thread default stream, candle's: each thread's)
//! gets its own instance of the varlen module (loaded on
//! the stream's first varlen call, or by [`ExternalContext::prepare_varlen`] before a CUDA graph
//! capture on it), and calls on one stream are ordered by the stream. A captured graph replays
//! the copies and launches of its capture stream's instance: replaying it concurrently with
//! eager varlen calls on that same stream is impossible (the stream orders them), but replaying
//! it on another stream while the capture stream runs varlen calls would share the instance —
//! replay graphs on their capture stream or on streams ordered with it (as torch does).

use super::{check_no_self_overlap, check_tensor, DeviceTensor, ExternalContext, RestoreCurrent};
use crate::attention::device::LoadedKernel;
use crate::attention::launch::varlen::{self as lv, Buffers, Target};
use crate::attention::validate;
use crate::error::{Error, Result};
use crate::spec::{AttentionParams, Layout};
use cudarc::driver::sys;
use std::sync::Arc;

/// One varlen call on caller-owned memory. `params.batch` is the number of sequences,
/// `params.seqlen_q` / `seqlen_k` are `max_seqlen_q` / `max_seqlen_k` (the launch count is
/// bounded by `batch · ceil(max_seqlen_q / 128)`); `params.layout` is not used. Q and O are
/// `[total_q, heads_q, head_dim]`, K and V `[total_k, heads_kv, head_dim]` with the strides'
/// `seq` and `head` (their `batch` is not used).
#[derive(Debug, Clone)]
pub struct VarlenCall {
    pub params: AttentionParams,
    pub total_q: usize,
    pub total_k: usize,
    pub q: DeviceTensor,
    pub k: DeviceTensor,
    pub v: DeviceTensor,
    pub out: DeviceTensor,
    /// fp32 `[heads_q, total_q]`, contiguous; 0 for none.
    pub lse: u64,
    /// i32 `[batch + 1]` prefix sums over the packed queries and keys (public metadata).
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    /// i32 `[batch]`: sequence b attends to its first `seqused_k[b]` keys only; 0 for none.
    pub seqused_k: u64,
    /// i32 `[batch]`: only sequence b's first `seqused_q[b]` queries are computed (its other
    /// rows of `out` and `lse` are not written); 0 for none.
    pub seqused_q: u64,
    /// [`workspace_bytes`] bytes, 16-byte aligned, used by no other launch that may run at the
    /// same time (0 when that size is 0).
    pub workspace: u64,
    /// Learnable attention sinks (gpt-oss): fp32 `[heads_q]`, contiguous, secret; 0 for none.
    /// `params.window` and `params.softcap` apply per sequence.
    pub sinks: u64,
    /// K and V are a paged KV cache's pools, read through its block table ([`VarlenPages`]);
    /// `None`: packed `[total_k, heads_kv, head_dim]`.
    pub pages: Option<VarlenPages>,
}

pub use crate::attention::launch::varlen::VarlenPages;

/// Bytes of workspace a varlen call of this shape needs.
pub fn workspace_bytes(params: &AttentionParams) -> usize {
    lv::workspace_bytes(params)
}

/// Checks a varlen call's shapes, alignment and strides (no GPU needed). The `cu_seqlens`
/// values are not read: they stay on the device (the builder clamps them into the pack).
pub fn validate_varlen(call: &VarlenCall) -> Result<()> {
    let p = &call.params;
    let row_q = p.heads_q * p.head_dim;
    let row_k = p.heads_kv * p.head_dim;
    let params = AttentionParams {
        layout: Layout::Bshd,
        ..p.clone()
    };
    lv::check_varlen_shapes(
        &params,
        call.total_q * row_q,
        [call.total_k * row_k; 2],
        call.total_q * row_q,
        (call.lse != 0).then_some(p.heads_q * call.total_q),
    )?;
    if let Some(pg) = &call.pages {
        validate::check_pages(&params, &pg.pages)?;
        if call.total_k != p.batch * p.seqlen_k {
            return Err(Error::invalid(
                "total_k",
                format!(
                    "a paged pack holds batch · capacity = {} virtual key rows, got {}",
                    p.batch * p.seqlen_k,
                    call.total_k
                ),
            ));
        }
        if pg.block_table == 0 || pg.block_table % 4 != 0 {
            return Err(Error::invalid(
                "block_table",
                "null or not 4-byte aligned device pointer",
            ));
        }
    }
    if call.total_q > i32::MAX as usize || call.total_k > i32::MAX as usize {
        return Err(Error::invalid("q", "more than 2^31 - 1 packed tokens"));
    }
    for (arg, ptr) in [
        ("cu_seqlens_q", call.cu_seqlens_q),
        ("cu_seqlens_k", call.cu_seqlens_k),
    ] {
        if ptr == 0 {
            return Err(Error::invalid(arg, "null device pointer"));
        }
    }
    for (arg, ptr) in [
        ("cu_seqlens_q", call.cu_seqlens_q),
        ("cu_seqlens_k", call.cu_seqlens_k),
        ("seqused_k", call.seqused_k),
        ("seqused_q", call.seqused_q),
        ("lse", call.lse),
        ("sinks", call.sinks),
    ] {
        if ptr % 4 != 0 {
            return Err(Error::invalid(arg, "device address is not 4-byte aligned"));
        }
    }
    if call.workspace % 16 != 0 || (call.workspace == 0 && workspace_bytes(p) > 0) {
        return Err(Error::invalid(
            "workspace",
            format!(
                "needs {} bytes at a 16-byte aligned device address",
                workspace_bytes(p)
            ),
        ));
    }
    let esize = p.dtype.size() as i64;
    if call.total_q > 0 {
        let q_ext = [1, call.total_q, p.heads_q];
        check_tensor("q", &call.q, q_ext, esize)?;
        check_tensor("out", &call.out, q_ext, esize)?;
        check_no_self_overlap(&call.out, q_ext, p.head_dim)?;
    }
    if let Some(pg) = &call.pages {
        let pool_ext = [pg.pages.num_pages, pg.pages.page_size, p.heads_kv];
        check_tensor("k", &call.k, pool_ext, esize)?;
        check_tensor("v", &call.v, pool_ext, esize)?;
    } else if call.total_k > 0 {
        let kv_ext = [1, call.total_k, p.heads_kv];
        check_tensor("k", &call.k, kv_ext, esize)?;
        check_tensor("v", &call.v, kv_ext, esize)?;
    } else if call.k.ptr % 16 != 0 || call.v.ptr % 16 != 0 || call.k.ptr == 0 || call.v.ptr == 0 {
        return Err(Error::invalid("k", "null or misaligned device pointer"));
    }
    Ok(())
}

/// The handle of CUDA's per-thread default stream (`CU_STREAM_PER_THREAD`).
const STREAM_PER_THREAD: usize = 2;

/// Which stream a varlen module instance belongs to: the handle, and for the per-thread default
/// stream (candle's default stream) the thread too, since that one handle names a different
/// stream in each thread, and two threads' work lists must not share a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct StreamKey(usize, Option<std::thread::ThreadId>);

impl StreamKey {
    pub(crate) fn of(stream: sys::CUstream) -> StreamKey {
        let handle = stream as usize;
        StreamKey(
            handle,
            (handle == STREAM_PER_THREAD).then(|| std::thread::current().id()),
        )
    }
}

impl ExternalContext {
    /// The varlen kernel of `params` for `stream` (its own module instance: see the module doc),
    /// loading it on first use.
    fn varlen_kernel(
        &self,
        params: &AttentionParams,
        paged: bool,
        stream: sys::CUstream,
    ) -> Result<Arc<LoadedKernel>> {
        let variant = if paged {
            crate::kernels::select::varlen_paged(params)
        } else {
            lv::variant_for(params)
        };
        let key = (variant, StreamKey::of(stream));
        let mut map = self
            .varlen_kernels
            .lock()
            .map_err(|_| Error::Other("kernel cache lock poisoned".into()))?;
        if let Some(k) = map.get(&key) {
            return Ok(k.clone());
        }
        let k = Arc::new(LoadedKernel::load(self.ctx.cuda(), variant.into())?);
        map.insert(key, k.clone());
        Ok(k)
    }

    /// Loads (compiling through the disk cache on first use) the varlen kernel of `params` for
    /// `stream` (the paged cache's build when `paged`), without launching: call it before
    /// capturing a CUDA graph on that stream.
    pub fn prepare_varlen(
        &self,
        params: &AttentionParams,
        paged: bool,
        stream: sys::CUstream,
    ) -> Result<()> {
        let _restore = RestoreCurrent::save()?;
        self.ctx.cuda().bind_to_thread()?;
        self.varlen_kernel(params, paged, stream).map(|_| ())
    }

    /// Validates `call` ([`validate_varlen`]) and enqueues the builder, the copies and the
    /// launches on `stream` (which may be capturing a graph, once the kernel is loaded for it).
    ///
    /// # Safety
    /// - `stream` is a live stream of this device's primary context (or null).
    /// - Every pointer is a live device allocation on this device covering what the call's
    ///   shape and strides reach (`cu_seqlens_*`: `batch + 1` i32s, `seqused_k`, `seqused_q`: `batch`), alive
    ///   until the kernels have finished on `stream`; `out`, `lse` and `workspace` overlap
    ///   nothing else.
    pub unsafe fn attention_varlen(&self, call: &VarlenCall, stream: sys::CUstream) -> Result<()> {
        validate_varlen(call)?;
        let cuda = self.ctx.cuda();
        cuda.check_err()?;
        let before = cudarc::driver::result::ctx::get_current()?;
        let _restore = if before == Some(cuda.cu_ctx()) {
            None
        } else {
            let restore = RestoreCurrent(before);
            // SAFETY: the context is this device's primary context, retained by `self`.
            unsafe { cudarc::driver::result::ctx::set_current(cuda.cu_ctx()) }?;
            Some(restore)
        };
        let p = AttentionParams {
            layout: Layout::Bshd,
            ..call.params.clone()
        };
        if call.total_q == 0 {
            return Ok(());
        }
        let kernel = self.varlen_kernel(&p, call.pages.is_some(), stream)?;
        let hd = p.head_dim;
        let q_ext = [1, call.total_q, p.heads_q];
        let kv_ext = match &call.pages {
            Some(pg) => [pg.pages.num_pages, pg.pages.page_size, p.heads_kv],
            None => [1, call.total_k.max(1), p.heads_kv],
        };
        let bufs = Buffers {
            ptrs: [call.q.ptr, call.k.ptr, call.v.ptr, call.out.ptr, call.lse],
            strides: [
                call.q.strides.normalized(q_ext, hd),
                call.k.strides.normalized(kv_ext, hd),
                call.v.strides.normalized(kv_ext, hd),
                call.out.strides.normalized(q_ext, hd),
            ],
            totals: [call.total_q, call.total_k],
            sinks: call.sinks,
            paged: call.pages,
        };
        let target = Target {
            stream,
            num_sms: self.ctx.num_sms(),
            kernel: &kernel,
        };
        let meta = [
            call.cu_seqlens_q,
            call.cu_seqlens_k,
            call.seqused_k,
            call.seqused_q,
        ];
        // SAFETY: the caller's contract; shapes, alignment and strides validated.
        unsafe { lv::launch_device_list(&target, &p, bufs, meta, call.workspace) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::validate::rule_of;
    use crate::spec::Strides;

    fn call() -> VarlenCall {
        let p = AttentionParams::new(3, 4, 200, 64).seqlen_k(300);
        let t = |ptr, heads| DeviceTensor {
            ptr,
            strides: Strides {
                batch: 0,
                seq: heads as i64 * 64,
                head: 64,
            },
        };
        VarlenCall {
            total_q: 250,
            total_k: 400,
            q: t(0x10000, 4),
            k: t(0x20000, 4),
            v: t(0x30000, 4),
            out: t(0x40000, 4),
            lse: 0x50000,
            cu_seqlens_q: 0x60000,
            cu_seqlens_k: 0x60100,
            seqused_k: 0,
            seqused_q: 0,
            workspace: 0x70000,
            sinks: 0,
            pages: None,
            params: p,
        }
    }

    #[test]
    fn the_per_thread_stream_is_keyed_by_thread() {
        let per_thread = STREAM_PER_THREAD as sys::CUstream;
        let other = 0x1234usize as sys::CUstream;
        let here = (StreamKey::of(per_thread), StreamKey::of(other));
        let there = std::thread::spawn(move || {
            (
                StreamKey::of(STREAM_PER_THREAD as sys::CUstream),
                StreamKey::of(0x1234usize as sys::CUstream),
            )
        })
        .join()
        .unwrap();
        assert_ne!(here.0, there.0, "one handle, two threads' streams");
        assert_eq!(
            here.1, there.1,
            "an ordinary stream is one stream in every thread"
        );
        assert_eq!(here.0, StreamKey::of(per_thread));
    }

    #[test]
    fn a_good_call_passes_and_needs_a_workspace() {
        validate_varlen(&call()).unwrap();
        // 3 sequences of up to 2 tiles: 6 items, one launch's list.
        assert_eq!(workspace_bytes(&call().params), 4096 * 16);
        let mut c = call();
        c.workspace = 0;
        assert_eq!(rule_of(validate_varlen(&c).unwrap_err()).0, "workspace");
        c.workspace = 0x70008;
        assert_eq!(rule_of(validate_varlen(&c).unwrap_err()).0, "workspace");
    }

    /// `call()` over a paged cache: 3 sequences of capacity 320 in 16-row pages of a 64-page pool.
    fn paged_call() -> VarlenCall {
        let mut c = call();
        c.params.seqlen_k = 320;
        c.total_k = 3 * 320;
        let pool = |ptr| DeviceTensor {
            ptr,
            strides: Strides {
                batch: 16 * 4 * 64,
                seq: 4 * 64,
                head: 64,
            },
        };
        c.k = pool(0x100000);
        c.v = pool(0x200000);
        c.pages = Some(VarlenPages {
            block_table: 0x80000,
            pages: crate::spec::Pages {
                page_size: 16,
                num_pages: 64,
            },
            left_padded: false,
        });
        c
    }

    #[test]
    fn a_paged_call_is_checked_before_any_launch() {
        validate_varlen(&paged_call()).unwrap();
        type Break = fn(&mut VarlenCall);
        let cases: [(&str, Break); 6] = [
            ("total_k", |c| c.total_k = 400),
            ("block_table", |c| c.pages.as_mut().unwrap().block_table = 0),
            ("block_table", |c| {
                c.pages.as_mut().unwrap().block_table = 0x80002
            }),
            ("page_size", |c| {
                c.pages.as_mut().unwrap().pages.page_size = 0
            }),
            ("seqlen_k", |c| {
                c.pages.as_mut().unwrap().pages.page_size = 7
            }),
            ("k", |c| c.k.strides.batch = 4),
        ];
        for (arg, breaks) in cases {
            let mut c = paged_call();
            breaks(&mut c);
            assert_eq!(rule_of(validate_varlen(&c).unwrap_err()).0, arg, "{arg}");
        }
    }

    #[test]
    fn each_bad_argument_is_named() {
        type Break = fn(&mut VarlenCall);
        let cases: [(&str, Break); 7] = [
            ("cu_seqlens_q", |c| c.cu_seqlens_q = 0),
            ("sinks", |c| c.sinks = 0x80002),
            ("cu_seqlens_k", |c| c.cu_seqlens_k = 0x60102),
            ("seqused_k", |c| c.seqused_k = 0x60201),
            ("q", |c| c.q.ptr = 0x10008),
            ("out", |c| {
                c.out.strides.seq = 0;
            }),
            ("heads_kv", |c| c.params.heads_kv = 3),
        ];
        for (arg, breaks) in cases {
            let mut c = call();
            breaks(&mut c);
            assert_eq!(rule_of(validate_varlen(&c).unwrap_err()).0, arg);
        }
    }
}
