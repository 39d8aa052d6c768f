//! Attention on memory and streams the caller owns: the entry point for frameworks (PyTorch
//! through the `flashcore` Python package, or any Rust framework) that hold their own tensors
//! and streams.
//!
//! Everything runs in the device's *primary* context, the one the CUDA runtime — and so
//! PyTorch — uses, so a framework's device pointers and streams are valid here as they are.
//! Each of Q, K, V and O is described by a base pointer and element strides for its
//! (batch, seq, head) dims; the head dim must be contiguous. Inputs are read in place through
//! TMA, which needs 16-byte aligned bases and strides; [`validate`] checks every rule (no GPU
//! needed), and [`ExternalContext::attention`] checks them again before it launches.
//!
//! ```no_run
//! use flashcore::attention::external::{DeviceTensor, ExternalCall, ExternalContext, Strides};
//! use flashcore::attention::{AttentionParams, Layout};
//! # fn demo(q: u64, k: u64, v: u64, o: u64, stream: cudarc::driver::sys::CUstream) -> flashcore::Result<()> {
//! let p = AttentionParams::new(2, 8, 1024, 64).causal(true);
//! let s = Strides::contiguous(Layout::Bhsd, 1024, 8, 64); // a torch [B, H, S, D] tensor
//! let t = |ptr| DeviceTensor { ptr, strides: s };
//! let call = ExternalCall::new(p, t(q), t(k), t(v), t(o));
//! let ctx = ExternalContext::new(0)?;
//! // SAFETY: q, k, v, o are live device allocations of the extents the strides describe,
//! // on device 0, and outlive the kernel; o aliases none of them.
//! unsafe { ctx.attention(&call, stream)? };
//! # Ok(()) }
//! ```

use super::context::Context;
use super::launch::Plan;
use super::validate::{self, TENSOR_ALIGN};
use crate::error::{Error, Result};
use crate::spec::Lengths;
use crate::spec::{AttentionParams, Layout};
pub use crate::spec::{DeviceTensor, Strides};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Varlen prefill on caller-owned memory.
pub mod varlen;

/// The KV append's rules and parameter block for a call.
mod append;
pub use varlen::{validate_varlen, VarlenCall, VarlenPages};

/// One attention call on caller-owned memory. `params` gives the shape (Q and O are
/// `[batch, seqlen_q, heads_q, head_dim]`, K and V `[batch, seqlen_k, heads_kv, head_dim]` in
/// index order, wherever the strides put them), dtype, mask and scale; `params.layout` is not
/// used — the strides say where every element is.
#[derive(Debug, Clone)]
pub struct ExternalCall {
    pub params: AttentionParams,
    pub q: DeviceTensor,
    pub k: DeviceTensor,
    pub v: DeviceTensor,
    pub out: DeviceTensor,
    /// fp32 `[batch, heads_q, seqlen_q]`, contiguous; 0 for none.
    pub lse: u64,
    /// Secret-length mode: i32 `[batch]` true lengths (needs seqlen_q == seqlen_k); 0 for none.
    pub lengths: u64,
    /// KV-cache mode ([`Lengths::KvCache`]): i32 `[batch]` key counts in K/V
    /// caches of capacity `seqlen_k`, with `seqlen_q` ≤ 16 new queries; 0 for none. Public
    /// metadata unless `kv_secret`.
    pub kv_lengths: u64,
    /// Keep the KV-cache counts secret (the kernel walks the capacity).
    pub kv_secret: bool,
    /// KV-cache mode: i32 `[batch]` first key of each sequence (flash-attn's `cache_leftpad`:
    /// keys before it are masked, the count stays the end of the range), as public or secret as
    /// the counts; 0 for none.
    pub kv_starts: u64,
    /// KV-cache mode, prefill-consistent: no key splits, each row the bits of the causal
    /// prefill's ([`Lengths::prefill_consistent`]).
    pub prefill_consistent: bool,
    /// A paged cache: i32 `[batch, seqlen_k / page_size]` page indices (public), with the pool's
    /// geometry in `pages`; K and V are then `[num_pages, page_size, heads_kv, head_dim]` pools
    /// (their strides: page, row, head). 0 for a contiguous cache.
    pub block_table: u64,
    pub pages: Option<crate::spec::Pages>,
    /// Decode mode's scratch: [`super::decode::workspace_bytes`] bytes, 16-byte aligned, used by
    /// no other launch that may run at the same time (a framework allocates it per call on the
    /// call's stream, or keeps one per stream: launches on one stream run in order); 0 when that
    /// size is 0.
    pub workspace: u64,
    /// KV-cache mode: new rows to write into the cache first, by a launch of their own on the
    /// same stream ([`super::kv_append`]); the attention then reads the counts after the append.
    pub append: Option<super::kv_append::KvAppend>,
    /// Learnable attention sinks (gpt-oss): fp32 `[heads_q]`, contiguous, one logit per query
    /// head added to each row's softmax denominator (no value row); secret. 0 for none.
    pub sinks: u64,
    /// The dynamic tile order's counter for causal prefill (kernels/fc_scheduler.cuh): at least
    /// [`tile_counter_words`] u32s, 8-byte aligned, its first two words zero (every launch leaves
    /// them zero), used by no other launch that may run at the same time (one per stream, as for
    /// the workspace). 0: the static order. Calls whose shape does not take the dynamic order
    /// ignore it.
    pub tile_counter: u64,
}

/// The u32 words a tile counter ([`ExternalCall::tile_counter()`]) needs on a device of
/// `num_sms` SMs.
pub fn tile_counter_words(num_sms: usize) -> usize {
    super::launch::DynamicOrder::counter_words(num_sms as u32)
}

impl ExternalCall {
    pub fn new(
        params: AttentionParams,
        q: DeviceTensor,
        k: DeviceTensor,
        v: DeviceTensor,
        out: DeviceTensor,
    ) -> ExternalCall {
        ExternalCall {
            params,
            q,
            k,
            v,
            out,
            lse: 0,
            lengths: 0,
            kv_lengths: 0,
            kv_secret: false,
            kv_starts: 0,
            prefill_consistent: false,
            block_table: 0,
            pages: None,
            workspace: 0,
            append: None,
            sinks: 0,
            tile_counter: 0,
        }
    }
    /// The dynamic tile order's counter (see the `tile_counter` field).
    pub fn tile_counter(mut self, ptr: u64) -> Self {
        self.tile_counter = ptr;
        self
    }
    /// Append new K/V rows at each sequence's count before the attention (flash-attn's
    /// `flash_attn_with_kvcache(k=, v=)`).
    pub fn append(mut self, append: super::kv_append::KvAppend) -> Self {
        self.append = Some(append);
        self
    }
    /// Learnable sinks (fp32 `[heads_q]` on the device).
    pub fn sinks(mut self, ptr: u64) -> Self {
        self.sinks = ptr;
        self
    }
    /// Keep the KV-cache counts secret.
    pub fn kv_secret(mut self, secret: bool) -> Self {
        self.kv_secret = secret;
        self
    }
    /// Each sequence's first key in the KV cache (left padding).
    pub fn kv_starts(mut self, ptr: u64) -> Self {
        self.kv_starts = ptr;
        self
    }
    /// Read the KV cache in the prefill-consistent mode.
    pub fn prefill_consistent(mut self, on: bool) -> Self {
        self.prefill_consistent = on;
        self
    }
    /// A paged cache's block table and geometry.
    pub fn paged(mut self, block_table: u64, pages: crate::spec::Pages) -> Self {
        self.block_table = block_table;
        self.pages = Some(pages);
        self
    }
    /// The lengths mode this call runs in.
    pub fn lengths_mode(&self) -> Lengths {
        if self.kv_lengths != 0 {
            Lengths::KvCache {
                secret: self.kv_secret,
                pages: self.pages,
                prefill_consistent: self.prefill_consistent,
            }
        } else if self.lengths != 0 {
            Lengths::SecretPadded
        } else {
            Lengths::None
        }
    }
    pub fn kv_lengths(mut self, ptr: u64) -> Self {
        self.kv_lengths = ptr;
        self
    }
    pub fn workspace(mut self, ptr: u64) -> Self {
        self.workspace = ptr;
        self
    }
    pub fn lse(mut self, ptr: u64) -> Self {
        self.lse = ptr;
        self
    }
    pub fn lengths(mut self, ptr: u64) -> Self {
        self.lengths = ptr;
        self
    }
}

/// TMA's limit on a byte stride.
const TMA_MAX_STRIDE_BYTES: i64 = 1 << 40;

/// Checks one tensor's base and strides (extents in (batch, seq, head) order).
pub(crate) fn check_tensor(
    arg: &'static str,
    t: &DeviceTensor,
    extents: [usize; 3],
    esize: i64,
) -> Result<()> {
    if t.ptr == 0 {
        return Err(Error::invalid(arg, "null device pointer"));
    }
    if t.ptr % TENSOR_ALIGN as u64 != 0 {
        return Err(Error::invalid(
            arg,
            format!(
                "device address {:#x} is not {TENSOR_ALIGN}-byte aligned (TMA needs it): pass a contiguous copy",
                t.ptr
            ),
        ));
    }
    let unit = TENSOR_ALIGN as i64 / esize;
    for ((name, stride), extent) in ["batch", "seq", "head"]
        .into_iter()
        .zip(t.strides.as_array())
        .zip(extents)
    {
        if extent == 1 {
            continue;
        }
        if stride <= 0 {
            return Err(Error::invalid(
                arg,
                format!(
                    "{name} stride is {stride}: strides must be positive (a broadcast view needs a contiguous copy)"
                ),
            ));
        }
        if stride % unit != 0 || stride * esize >= TMA_MAX_STRIDE_BYTES {
            return Err(Error::invalid(
                arg,
                format!(
                    "{name} stride {stride} elements is not a multiple of {unit} (16 bytes) below 2^40 bytes, as TMA needs: pass a contiguous copy"
                ),
            ));
        }
    }
    Ok(())
}

/// The output must not overlap itself (two rows writing one element would race): sorted by
/// stride, each dim must step past everything the dims below it span.
fn check_no_self_overlap(t: &DeviceTensor, extents: [usize; 3], head_dim: usize) -> Result<()> {
    let mut dims: Vec<(i64, usize)> = t
        .strides
        .as_array()
        .into_iter()
        .zip(extents)
        .filter(|&(_, e)| e > 1)
        .collect();
    dims.push((1, head_dim));
    dims.sort();
    let mut span = 0i64; // elements spanned by the dims seen so far, minus one
    for (stride, extent) in dims {
        if stride <= span {
            return Err(Error::invalid(
                "out",
                "strides make the output overlap itself: it must be a tensor whose elements are distinct",
            ));
        }
        span += stride * (extent as i64 - 1);
    }
    Ok(())
}

/// Every rule an [`ExternalCall`] must meet, checked on the host with no GPU: the shape rules
/// of [`Context::plan`], then each tensor's alignment and strides, and that the output's
/// elements are distinct. Cannot check that the pointers are live or large enough.
pub fn validate(call: &ExternalCall) -> Result<()> {
    let p = &call.params;
    validate::check_params(p)?;
    if let Some(a) = &call.append {
        append::validate(call, a)?;
    }
    if call.kv_lengths != 0 {
        if call.lengths != 0 {
            return Err(Error::invalid(
                "kv_lengths",
                "give either secret lengths (padded prefill) or KV-cache key counts, not both",
            ));
        }
        validate::check_kv_cache(p)?;
        if call.kv_lengths % 4 != 0 {
            return Err(Error::invalid(
                "kv_lengths",
                "device address is not 4-byte aligned",
            ));
        }
        if call.kv_starts % 4 != 0 {
            return Err(Error::invalid(
                "cache_leftpad",
                "device address is not 4-byte aligned",
            ));
        }
    } else if call.kv_starts != 0 {
        return Err(Error::invalid(
            "cache_leftpad",
            "first keys (left padding) need KV-cache key counts",
        ));
    }
    match (call.pages, call.block_table) {
        (None, 0) => {}
        (Some(pg), table) if call.kv_lengths != 0 && table != 0 => {
            validate::check_pages(p, &pg)?;
            if table % 4 != 0 {
                return Err(Error::invalid(
                    "block_table",
                    "device address is not 4-byte aligned",
                ));
            }
        }
        _ => return Err(Error::invalid(
            "block_table",
            "a paged cache needs KV-cache key counts, a block table and its page geometry together",
        )),
    }
    if call.lengths != 0 {
        validate::check_secret_len(p)?;
        if call.lengths % 4 != 0 {
            return Err(Error::invalid(
                "lengths",
                "device address is not 4-byte aligned",
            ));
        }
    }
    if call.tile_counter % 8 != 0 {
        return Err(Error::invalid(
            "tile_counter",
            format!(
                "device address {:#x} is not 8-byte aligned",
                call.tile_counter
            ),
        ));
    }
    if call.workspace % 16 != 0 {
        return Err(Error::invalid(
            "workspace",
            "device address is not 16-byte aligned",
        ));
    }
    if call.lse % 4 != 0 {
        return Err(Error::invalid(
            "lse",
            "device address is not 4-byte aligned",
        ));
    }
    let esize = p.dtype.size() as i64;
    let q_ext = [p.batch, p.seqlen_q, p.heads_q];
    let kv_ext = kv_extents(call);
    check_tensor("q", &call.q, q_ext, esize)?;
    check_tensor("k", &call.k, kv_ext, esize)?;
    check_tensor("v", &call.v, kv_ext, esize)?;
    check_tensor("out", &call.out, q_ext, esize)?;
    check_no_self_overlap(&call.out, q_ext, p.head_dim)?;
    Ok(())
}

/// K/V's (batch, seq, head) extents: the cache's, or a paged pool's (pages, page rows, heads).
fn kv_extents(call: &ExternalCall) -> [usize; 3] {
    let p = &call.params;
    match call.pages {
        Some(pg) => [pg.num_pages, pg.page_size, p.heads_kv],
        None => [p.batch, p.seqlen_k, p.heads_kv],
    }
}

/// What distinguishes one plan from another (the layout is not used here: strides are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    shape: [usize; 6],
    dtype: crate::spec::DType,
    causal: bool,
    scale_bits: Option<u32>,
    lengths: Lengths,
    /// The window and the softcap shape the plan's parameter block (and the build).
    window: crate::spec::Window,
    softcap_bits: u32,
}

/// Plans kept per context; past this many shapes the cache starts over (a decode loop makes a
/// new shape per token, and a plan is cheap to remake).
const MAX_PLANS: usize = 256;

/// Puts the thread's current CUDA context (or none) back when dropped: the CUDA runtime — and so
/// torch — reads its current device from it, and a call on device 1 must not leave device 1
/// current for a caller working on device 0.
struct RestoreCurrent(Option<sys::CUcontext>);

impl RestoreCurrent {
    fn save() -> Result<RestoreCurrent> {
        Ok(RestoreCurrent(cudarc::driver::result::ctx::get_current()?))
    }
}

impl Drop for RestoreCurrent {
    fn drop(&mut self) {
        let ctx = self.0.unwrap_or(std::ptr::null_mut());
        // SAFETY: `ctx` was current on this thread when saved, so it is live (null unbinds).
        let _ = unsafe { cudarc::driver::result::ctx::set_current(ctx) };
    }
}

/// A device's primary context with flashcore's kernels loaded on it, launching on streams the
/// caller passes. Thread-safe; one per device is enough.
pub struct ExternalContext {
    ctx: Context,
    plans: Mutex<HashMap<PlanKey, Arc<Plan>>>,
    /// Held across the two launches of a call with a workspace, so that calls from several
    /// threads that share one workspace per stream (the Python package does) enqueue their
    /// pairs whole, never interleaved on that stream.
    workspace_launch: Mutex<()>,
    /// Varlen kernels per (variant, stream): one module instance, so one `__constant__` work
    /// list, per stream ([`varlen`]).
    varlen_kernels: Mutex<
        HashMap<(crate::kernels::Variant, varlen::StreamKey), Arc<super::device::LoadedKernel>>,
    >,
}

impl ExternalContext {
    /// Retains device `ordinal`'s primary context. Errors (never panics) without a driver or a
    /// device, or when the device is not sm_90.
    /// The thread's current context is left as it was (creating the context binds it).
    pub fn new(ordinal: usize) -> Result<ExternalContext> {
        super::context::probe_driver()?;
        // Reading the current context needs an initialised driver, and nothing may have called
        // cuInit yet (a Rust framework's first CUDA call can be this one; torch always had).
        cudarc::driver::result::init()?;
        let _restore = RestoreCurrent::save()?;
        Ok(ExternalContext {
            ctx: Context::new(ordinal)?,
            plans: Mutex::new(HashMap::new()),
            workspace_launch: Mutex::new(()),
            varlen_kernels: Mutex::new(HashMap::new()),
        })
    }

    /// The underlying context (its own stream is not used by [`ExternalContext::attention`]).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    fn plan(&self, p: &AttentionParams, lengths: Lengths) -> Result<Arc<Plan>> {
        self.plan_made(p, lengths, true)
            .map(|plan| plan.expect("made when missing"))
    }

    /// The plan of `p` and `lengths`: the one made before, else (`make`) a new one, loading its
    /// kernel, or (not `make`) none — also while another thread holds the plans, which it may do
    /// for a whole compilation.
    fn plan_made(
        &self,
        p: &AttentionParams,
        lengths: Lengths,
        make: bool,
    ) -> Result<Option<Arc<Plan>>> {
        let key = PlanKey {
            shape: [
                p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim,
            ],
            dtype: p.dtype,
            causal: p.causal,
            scale_bits: p.scale.map(f32::to_bits),
            lengths,
            window: p.window,
            softcap_bits: p.softcap.to_bits(),
        };
        let poisoned = || Error::Other("plan cache lock poisoned".into());
        let mut plans = if make {
            self.plans.lock().map_err(|_| poisoned())?
        } else {
            match self.plans.try_lock() {
                Ok(plans) => plans,
                Err(std::sync::TryLockError::WouldBlock) => return Ok(None),
                Err(std::sync::TryLockError::Poisoned(_)) => return Err(poisoned()),
            }
        };
        if let Some(plan) = plans.get(&key) {
            return Ok(Some(plan.clone()));
        }
        if !make {
            return Ok(None);
        }
        let params = AttentionParams {
            layout: Layout::Bshd,
            ..p.clone()
        };
        let plan = Arc::new(match lengths {
            Lengths::SecretPadded => self.ctx.plan_secret_len(&params)?,
            kv @ Lengths::KvCache { .. } => self.ctx.plan_lengths(&params, kv, false)?,
            Lengths::None => self.ctx.plan_external(&params)?,
        });
        if plans.len() >= MAX_PLANS {
            plans.clear();
        }
        plans.insert(key, plan.clone());
        Ok(Some(plan))
    }

    /// Loads (compiling through the disk cache on first use) the kernel `params` needs, without
    /// launching: call once before capturing a CUDA graph, since loading a module is not
    /// allowed inside a capture.
    pub fn prepare(&self, params: &AttentionParams, secret_len: bool) -> Result<()> {
        let lengths = if secret_len {
            Lengths::SecretPadded
        } else {
            Lengths::None
        };
        self.prepare_lengths(params, lengths)
    }

    /// [`ExternalContext::prepare`] for any lengths mode (a KV-cache call's too).
    pub fn prepare_lengths(&self, params: &AttentionParams, lengths: Lengths) -> Result<()> {
        let _restore = RestoreCurrent::save()?;
        self.ctx.cuda().bind_to_thread()?;
        self.plan(params, lengths).map(|_| ())
    }

    /// Validates `call` ([`validate`]) and enqueues the kernel on `stream`, which may be
    /// capturing a CUDA graph (after [`ExternalContext::prepare`] or an earlier call of the same
    /// shape loaded the kernel).
    ///
    /// # Safety
    /// - `stream` is a live stream of this device's primary context (or null, the legacy
    ///   default stream).
    /// - Each pointer is a live device allocation on this device that covers every element its
    ///   strides reach for the call's shape (2-byte elements of `params.dtype`; `lse`:
    ///   `batch·heads_q·seqlen_q` f32s; `lengths`: `batch` i32s), and stays alive until the
    ///   kernel has finished on `stream`.
    /// - `out` and `lse` overlap neither each other nor any input.
    pub unsafe fn attention(&self, call: &ExternalCall, stream: sys::CUstream) -> Result<()> {
        // SAFETY: the caller's contract, as this function's.
        unsafe { self.attention_made(call, stream, true) }.map(|_| ())
    }

    /// [`ExternalContext::attention`] where the kernel `call` needs is loaded already (an
    /// earlier call or [`ExternalContext::prepare_lengths`] of its shape): `Ok(true)` once
    /// enqueued. `Ok(false)`, having done nothing, where it is not, or while another thread
    /// makes a plan: nothing here compiles, loads a module or waits for a compilation, so a
    /// caller may hold a lock that a compilation should not block (Python's GIL) and make the
    /// call that loads the kernel without that lock only then.
    ///
    /// # Safety
    /// As for [`ExternalContext::attention`].
    pub unsafe fn attention_loaded(
        &self,
        call: &ExternalCall,
        stream: sys::CUstream,
    ) -> Result<bool> {
        // SAFETY: the caller's contract, as this function's.
        unsafe { self.attention_made(call, stream, false) }
    }

    /// [`ExternalContext::attention`], making the plan if missing (`make`), else returning
    /// `Ok(false)` where it is missing.
    unsafe fn attention_made(
        &self,
        call: &ExternalCall,
        stream: sys::CUstream,
        make: bool,
    ) -> Result<bool> {
        validate(call)?;
        let lengths = call.lengths_mode();
        // Make this device's primary context current for the launch, and give the thread back
        // the context it had: the CUDA runtime (torch) reads its current device from it. When
        // it is current already (torch's calls on its current device), nothing to switch.
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
        let Some(plan) = self.plan_made(&call.params, lengths, make)? else {
            return Ok(false);
        };
        // SAFETY: as above, `call` validated.
        unsafe { self.launch_current(call, &plan, stream) }.map(|_| true)
    }

    /// The launch itself, with this device's context current.
    ///
    /// # Safety
    /// As for [`ExternalContext::attention`]; `call` validated.
    unsafe fn launch_current(
        &self,
        call: &ExternalCall,
        plan: &Plan,
        stream: sys::CUstream,
    ) -> Result<()> {
        let p = &call.params;
        let hd = p.head_dim;
        let q_ext = [p.batch, p.seqlen_q, p.heads_q];
        let kv_ext = kv_extents(call);
        let strides = [
            call.q.strides.normalized(q_ext, hd),
            call.k.strides.normalized(kv_ext, hd),
            call.v.strides.normalized(kv_ext, hd),
            call.out.strides.normalized(q_ext, hd),
        ];
        let ptrs = [
            call.q.ptr,
            call.k.ptr,
            call.v.ptr,
            call.out.ptr,
            call.lse,
            // At most one of the two is set (validated); after an append, the counts it wrote.
            match (&call.append, call.kv_lengths) {
                (Some(a), _) => a.counts,
                (None, 0) => call.lengths,
                (None, kv) => kv,
            },
            call.workspace,
            call.block_table,
            call.kv_starts,
            call.sinks,
        ];
        let _pair = if call.workspace != 0 {
            Some(
                self.workspace_launch
                    .lock()
                    .map_err(|_| Error::Other("launch lock poisoned".into()))?,
            )
        } else {
            None
        };
        if let Some(a) = &call.append {
            let mut ap = append::params(call, a, [strides[1].as_array(), strides[2].as_array()]);
            // SAFETY: the caller's contract (the new rows, caches, counts and table are live
            // device memory covering their strides); validated above.
            unsafe { plan.launch_append(&mut ap, stream)? };
        }
        // SAFETY: the caller's contract above; shapes, alignment and strides validated.
        unsafe { plan.launch_on(ptrs, call.tile_counter, strides, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::validate::rule_of;
    use crate::spec::DType;

    fn bhsd(p: &AttentionParams, seqlen: usize, heads: usize, ptr: u64) -> DeviceTensor {
        DeviceTensor {
            ptr,
            strides: Strides::contiguous(Layout::Bhsd, seqlen, heads, p.head_dim),
        }
    }

    fn call(p: AttentionParams) -> ExternalCall {
        let q = bhsd(&p, p.seqlen_q, p.heads_q, 0x10000);
        let k = bhsd(&p, p.seqlen_k, p.heads_kv, 0x20000);
        let v = bhsd(&p, p.seqlen_k, p.heads_kv, 0x30000);
        let o = bhsd(&p, p.seqlen_q, p.heads_q, 0x40000);
        ExternalCall::new(p, q, k, v, o)
    }

    #[test]
    fn contiguous_calls_pass() {
        validate(&call(AttentionParams::new(2, 4, 100, 64))).unwrap();
        let gqa = AttentionParams {
            heads_kv: 2,
            ..AttentionParams::new(1, 8, 33, 128)
                .seqlen_k(70)
                .dtype(DType::Bf16)
        };
        validate(&call(gqa).lse(0x50000)).unwrap();
    }

    #[test]
    fn transposed_view_passes() {
        // A bshd tensor viewed as bhsd (torch's `.transpose(1, 2)`): strides (S·H·D, H·D, D).
        let p = AttentionParams::new(2, 4, 100, 64);
        let mut c = call(p.clone());
        c.q.strides = Strides::contiguous(Layout::Bshd, 100, 4, 64);
        validate(&c).unwrap();
    }

    #[test]
    fn extent_one_dims_take_any_stride() {
        let p = AttentionParams::new(1, 1, 1, 64);
        let mut c = call(p);
        c.q.strides = Strides {
            batch: 0,
            seq: 3,
            head: -7,
        };
        validate(&c).unwrap();
        assert_eq!(
            c.q.strides.normalized([1, 1, 1], 64),
            Strides {
                batch: 64,
                seq: 64,
                head: 64
            }
        );
    }

    #[test]
    fn rejects_null_and_misaligned_pointers() {
        let mut c = call(AttentionParams::new(1, 2, 8, 64));
        c.k.ptr = 0;
        let (arg, r) = rule_of(validate(&c).unwrap_err());
        assert_eq!((arg, r.contains("null")), ("k", true));
        c.k.ptr = 0x20008;
        let (arg, r) = rule_of(validate(&c).unwrap_err());
        assert_eq!(arg, "k");
        assert!(r.contains("16-byte aligned"), "{r}");
    }

    #[test]
    fn kv_lengths_rules() {
        let c = call(AttentionParams::new(2, 4, 1, 64).seqlen_k(500)).kv_lengths(0x60000);
        assert!(validate(&c).is_ok());
        let (arg, r) = rule_of(validate(&c.clone().lengths(0x70000)).unwrap_err());
        assert_eq!(arg, "kv_lengths");
        assert!(r.contains("not both"), "{r}");
        let (arg, _) = rule_of(validate(&c.clone().kv_lengths(0x60002)).unwrap_err());
        assert_eq!(arg, "kv_lengths");
        let long = call(AttentionParams::new(2, 4, 17, 64).seqlen_k(500)).kv_lengths(0x60000);
        let (arg, r) = rule_of(validate(&long).unwrap_err());
        assert_eq!(arg, "seqlen_q");
        assert!(r.contains("at most 16"), "{r}");
    }

    #[test]
    fn rejects_a_misaligned_tile_counter() {
        let c = call(AttentionParams::new(2, 4, 2048, 64).causal(true)).tile_counter(0x50004);
        let (arg, r) = rule_of(validate(&c).unwrap_err());
        assert_eq!(arg, "tile_counter");
        assert!(r.contains("8-byte aligned"), "{r}");
        assert!(validate(&c.tile_counter(0x50008)).is_ok());
    }

    #[test]
    fn rejects_a_misaligned_workspace() {
        let c = call(AttentionParams::new(1, 2, 1, 64).seqlen_k(4096)).workspace(0x50008);
        let (arg, r) = rule_of(validate(&c).unwrap_err());
        assert_eq!(arg, "workspace");
        assert!(r.contains("16-byte aligned"), "{r}");
        assert!(validate(&c.workspace(0x50010)).is_ok());
    }

    #[test]
    fn rejects_strides_tma_cannot_express() {
        let p = AttentionParams::new(2, 2, 8, 64);
        // A seq stride of 68 elements (136 bytes) is not a multiple of 16 bytes.
        let mut c = call(p.clone());
        c.v.strides.seq = 68;
        let (arg, r) = rule_of(validate(&c).unwrap_err());
        assert_eq!(arg, "v");
        assert!(r.contains("seq stride 68"), "{r}");
        // A broadcast (stride 0) over a dim of extent 2.
        let mut c = call(p.clone());
        c.k.strides.head = 0;
        let (arg, r) = rule_of(validate(&c).unwrap_err());
        assert_eq!(arg, "k");
        assert!(r.contains("positive"), "{r}");
        // Negative.
        let mut c = call(p);
        c.q.strides.batch = -1024;
        assert_eq!(rule_of(validate(&c).unwrap_err()).0, "q");
    }

    #[test]
    fn rejects_self_overlapping_output() {
        // Heads and sequence positions on the same rows: valid to read, not to write.
        let p = AttentionParams::new(1, 2, 8, 64);
        let mut c = call(p);
        c.out.strides = Strides {
            batch: 1024,
            seq: 64,
            head: 64,
        };
        let (arg, r) = rule_of(validate(&c).unwrap_err());
        assert_eq!(arg, "out");
        assert!(r.contains("overlap itself"), "{r}");
        // The same strides on an input are fine (reads only).
        let mut c2 = call(AttentionParams::new(1, 2, 8, 64));
        c2.k.strides = c.out.strides;
        validate(&c2).unwrap();
    }

    #[test]
    fn shape_rules_apply() {
        let (arg, _) = rule_of(validate(&call(AttentionParams::new(1, 2, 8, 80))).unwrap_err());
        assert_eq!(arg, "head_dim");
        let p = AttentionParams {
            heads_kv: 3,
            ..AttentionParams::new(1, 4, 8, 64)
        };
        assert_eq!(rule_of(validate(&call(p)).unwrap_err()).0, "heads_kv");
    }

    #[test]
    fn secret_lengths_need_equal_lengths_and_alignment() {
        let p = AttentionParams::new(2, 2, 16, 64);
        validate(&call(p.clone()).lengths(0x60000)).unwrap();
        let (arg, _) = rule_of(validate(&call(p.clone()).lengths(0x60002)).unwrap_err());
        assert_eq!(arg, "lengths");
        let (arg, _) = rule_of(validate(&call(p.seqlen_k(17)).lengths(0x60000)).unwrap_err());
        assert_eq!(arg, "seqlen_k");
    }

    #[test]
    fn lse_alignment() {
        let c = call(AttentionParams::new(1, 1, 8, 64)).lse(0x50002);
        assert_eq!(rule_of(validate(&c).unwrap_err()).0, "lse");
    }
}
