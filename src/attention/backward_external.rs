//! The backward pass on memory and streams the caller owns: the entry point a framework's
//! autograd needs (the PyTorch package's, once it registers one). Runs in the device's primary
//! context, like [`ExternalContext::attention`], on the stream the caller passes.
//!
//! Q, K and V may have any strides TMA can read (views of a fused QKV projection, `bhsd`
//! transposes); O, dO and the gradients are contiguous in `params.layout` (a framework makes dO
//! contiguous and allocates the gradients so). The scratch of [`super::backward::workspace_bytes`]
//! comes from the caller too (its allocator, on the call's stream), so calls on different
//! streams never share it.

use super::backward::{
    check_backward_params, check_backward_sinks, workspace_bytes, BackwardPtrs, InputStrides,
};
use super::external::{self, DeviceTensor, ExternalCall, ExternalContext};
use super::validate::TENSOR_ALIGN;
use crate::error::{Error, Result};
use crate::spec::AttentionParams;
use crate::spec::Strides;
use cudarc::driver::sys;

/// One backward call on caller-owned memory. `params` gives the shape, dtype, mask and scale of
/// the forward call, and the layout in which `o`, `d_o`, `dq`, `dk` and `dv` are contiguous.
#[derive(Debug, Clone)]
pub struct ExternalBackwardCall {
    pub params: AttentionParams,
    pub q: DeviceTensor,
    pub k: DeviceTensor,
    pub v: DeviceTensor,
    /// The forward's output (q's shape), contiguous in `params.layout`.
    pub o: u64,
    /// The forward's log-sum-exp, fp32 `[batch, heads_q, seqlen_q]` contiguous; 0 is an error.
    pub lse: u64,
    /// The output gradient (q's shape), contiguous in `params.layout`.
    pub d_o: u64,
    /// Outputs: dq (q's shape), dk and dv (k's shape), contiguous in `params.layout`.
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    /// [`workspace_bytes`] bytes of scratch, 16-byte aligned, used by no other launch in flight.
    pub workspace: u64,
    /// Learnable sinks: the forward's fp32 `[heads_q]` logits and their gradient
    /// fp32 `[heads_q]` (written); both 0 for a call without sinks.
    pub sinks: u64,
    pub dsink: u64,
}

fn aligned(arg: &'static str, ptr: u64, align: u64) -> Result<()> {
    if ptr == 0 {
        return Err(Error::invalid(arg, "null device pointer"));
    }
    if ptr % align != 0 {
        return Err(Error::invalid(
            arg,
            format!("device address {ptr:#x} is not {align}-byte aligned"),
        ));
    }
    Ok(())
}

/// Every rule of an [`ExternalBackwardCall`], checked on the host with no GPU: the backward's
/// shape rules, Q, K, V as the forward checks them (alignment, TMA-readable strides), the LSE's
/// presence, and the alignment of everything else. Cannot check that the pointers are live or
/// large enough.
pub fn validate_backward(call: &ExternalBackwardCall) -> Result<()> {
    let p = &call.params;
    check_backward_params(p)?;
    if call.lse == 0 {
        return Err(Error::invalid(
            "lse",
            "the backward needs the forward's log-sum-exp (f32 [batch, heads_q, seqlen_q]): run the forward with it",
        ));
    }
    // Q, K, V (and O as the forward's output) by the forward's rules.
    let o = DeviceTensor {
        ptr: call.o,
        strides: Strides::contiguous(p.layout, p.seqlen_q, p.heads_q, p.head_dim),
    };
    external::validate(&ExternalCall::new(p.clone(), call.q, call.k, call.v, o).lse(call.lse))
        .map_err(|e| match e {
            Error::InvalidArgument { arg: "out", rule } => {
                Error::InvalidArgument { arg: "o", rule }
            }
            other => other,
        })?;
    let a = TENSOR_ALIGN as u64;
    aligned("d_o", call.d_o, a)?;
    aligned("dq", call.dq, a)?;
    aligned("dk", call.dk, a)?;
    aligned("dv", call.dv, a)?;
    aligned("workspace", call.workspace, a)?;
    match (call.sinks, call.dsink) {
        (0, 0) => {}
        (s, d) => {
            let len = p.heads_q;
            check_backward_sinks(
                p,
                (s != 0).then_some((len, s)),
                (d != 0).then_some((len, d)),
            )?;
        }
    }
    Ok(())
}

/// Puts the thread's current CUDA context back when dropped (the CUDA runtime, and so torch,
/// reads its current device from it).
struct Restore(Option<sys::CUcontext>);

impl Drop for Restore {
    fn drop(&mut self) {
        let ctx = self.0.unwrap_or(std::ptr::null_mut());
        // SAFETY: `ctx` was current on this thread when saved, so it is live (null unbinds).
        let _ = unsafe { cudarc::driver::result::ctx::set_current(ctx) };
    }
}

impl ExternalContext {
    /// Enqueues the backward of `call` on `stream` (three kernels: preprocess, dK/dV, dQ). Bitwise
    /// deterministic and batch-invariant, as [`crate::attention::Context::attention_backward`].
    /// Every rule is checked first ([`validate_backward`]).
    ///
    /// # Safety
    /// Every pointer must be a live device allocation on this device holding what its shape and
    /// strides reach (the workspace [`workspace_bytes`] bytes), none of the outputs may overlap
    /// another buffer, all must outlive the kernels, and `stream` must be a live stream of this
    /// device's primary context.
    pub unsafe fn attention_backward(
        &self,
        call: &ExternalBackwardCall,
        stream: sys::CUstream,
    ) -> Result<()> {
        validate_backward(call)?;
        let cuda = self.context().cuda();
        cuda.check_err()?;
        let before = cudarc::driver::result::ctx::get_current()?;
        let _restore = if before == Some(cuda.cu_ctx()) {
            None
        } else {
            // SAFETY: the context is this device's primary context, retained by `self`.
            unsafe { cudarc::driver::result::ctx::set_current(cuda.cu_ctx()) }?;
            Some(Restore(before))
        };
        let plan = self.context().plan_backward_external(&call.params)?;
        let ptrs = BackwardPtrs {
            q: call.q.ptr,
            k: call.k.ptr,
            v: call.v.ptr,
            o: call.o,
            lse: call.lse,
            d_o: call.d_o,
            dq: call.dq,
            dk: call.dk,
            dv: call.dv,
            sinks: call.sinks,
            dsink: call.dsink,
        };
        let p = &call.params;
        let input = InputStrides {
            q: normalized(call.q.strides, [p.batch, p.seqlen_q, p.heads_q], p.head_dim),
            k: normalized(
                call.k.strides,
                [p.batch, p.seqlen_k, p.heads_kv],
                p.head_dim,
            ),
            v: normalized(
                call.v.strides,
                [p.batch, p.seqlen_k, p.heads_kv],
                p.head_dim,
            ),
        };
        debug_assert_eq!(workspace_bytes(p) % 16, 0);
        // SAFETY: validated above; liveness and sizes are the caller's contract.
        unsafe { plan.launch_on(&ptrs, input, call.workspace, stream, [true; 3]) }
    }
}

/// A dim of extent 1 may carry any stride (frameworks give such dims odd ones); TMA wants a
/// multiple of 16 bytes, and any value is right for a dim that is never stepped over.
fn normalized(s: Strides, extents: [usize; 3], head_dim: usize) -> Strides {
    let fix = |stride: i64, extent: usize| if extent == 1 { head_dim as i64 } else { stride };
    Strides {
        batch: fix(s.batch, extents[0]),
        seq: fix(s.seq, extents[1]),
        head: fix(s.head, extents[2]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::validate::arg_of;
    use crate::attention::Layout;

    fn call() -> ExternalBackwardCall {
        let p = AttentionParams::new(2, 4, 100, 64)
            .seqlen_k(80)
            .layout(Layout::Bhsd);
        let p = AttentionParams { heads_kv: 2, ..p };
        // Q, K, V as views of one fused [B, S, 3, H, D] buffer would be strided; here Q is a
        // bshd view of width 3·H·D.
        let t = |ptr, strides| DeviceTensor { ptr, strides };
        let fused = Strides {
            batch: 100 * 3 * 4 * 64,
            seq: 3 * 4 * 64,
            head: 64,
        };
        let kv = Strides::contiguous(Layout::Bhsd, 80, 2, 64);
        ExternalBackwardCall {
            params: p,
            q: t(0x10000, fused),
            k: t(0x20000, kv),
            v: t(0x30000, kv),
            o: 0x40000,
            lse: 0x50000,
            d_o: 0x60000,
            dq: 0x70000,
            dk: 0x80000,
            dv: 0x90000,
            workspace: 0xa0000,
            sinks: 0,
            dsink: 0,
        }
    }

    #[test]
    fn a_strided_well_formed_call_passes() {
        validate_backward(&call()).unwrap();
    }

    #[test]
    fn missing_lse_is_rejected() {
        let mut c = call();
        c.lse = 0;
        let e = validate_backward(&c).unwrap_err();
        assert!(e.to_string().contains("log-sum-exp"), "{e}");
        assert_eq!(arg_of(Err(e)), "lse");
    }

    #[test]
    fn sinks_without_their_gradient_or_misaligned_are_rejected() {
        let mut c = call();
        c.sinks = 0xb0000;
        c.dsink = 0xc0000;
        validate_backward(&c).unwrap();
        c.dsink = 0;
        assert_eq!(arg_of(validate_backward(&c)), "dsink");
        let mut c = call();
        c.dsink = 0xc0000;
        assert_eq!(arg_of(validate_backward(&c)), "sinks");
        c.sinks = 0xb0002;
        assert_eq!(arg_of(validate_backward(&c)), "sinks");
    }

    #[test]
    fn unreadable_input_strides_are_rejected() {
        let mut c = call();
        c.k.strides.seq = 65; // not a multiple of 16 bytes
        assert_eq!(arg_of(validate_backward(&c)), "k");
        let mut c = call();
        c.q.strides.head = -64;
        assert_eq!(arg_of(validate_backward(&c)), "q");
    }

    #[test]
    fn null_or_misaligned_buffers_are_rejected() {
        for (which, name) in [
            (0, "o"),
            (1, "d_o"),
            (2, "dq"),
            (3, "dk"),
            (4, "dv"),
            (5, "workspace"),
        ] {
            for bad in [0u64, 0x1008] {
                let mut c = call();
                let field = match which {
                    0 => &mut c.o,
                    1 => &mut c.d_o,
                    2 => &mut c.dq,
                    3 => &mut c.dk,
                    4 => &mut c.dv,
                    _ => &mut c.workspace,
                };
                *field = bad;
                assert_eq!(arg_of(validate_backward(&c)), name, "{name} = {bad:#x}");
            }
        }
    }

    #[test]
    fn the_backward_shape_rules_apply() {
        let mut c = call();
        c.params.heads_kv = 3; // 4 query heads are not a multiple of 3
        assert_eq!(arg_of(validate_backward(&c)), "heads_kv");
    }

    #[test]
    fn extent_one_dims_get_a_readable_stride() {
        let s = Strides {
            batch: 1,
            seq: 7,
            head: 64,
        };
        let n = normalized(s, [1, 1, 4], 64);
        assert_eq!((n.batch, n.seq, n.head), (64, 64, 64));
        assert_eq!(normalized(s, [2, 5, 4], 64), s);
    }
}
