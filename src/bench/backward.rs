//! `flashcore bench --backward`: the launcher of the backward pass (dQ, dK, dV), alone or after
//! the forward, over rotated buffer sets like the forward's [`super::device::PlanLauncher`].
//! Each set holds random Q, K, V and dO, the forward's O and LSE (computed once when the set is
//! made, so the backward reads a real softmax), and the three gradients.

use super::device::{random_bits, Launcher};
use crate::attention::backward::{BackwardPlan, BackwardPtrs};
use crate::attention::{AttentionParams, Context, Plan};
use crate::error::Result;
use cudarc::driver::{CudaSlice, DevicePtr};

/// Bytes one backward call reads (Q, K, V, O, dO, LSE) and everything one set holds (those and
/// dQ, dK, dV).
pub fn set_bytes(p: &AttentionParams) -> (u64, u64) {
    let e = p.dtype.size() as u64;
    let (q, kv, lse) = (p.q_len() as u64, p.kv_len() as u64, p.lse_len() as u64);
    let inputs = (3 * q + 2 * kv) * e + 4 * lse;
    (inputs, inputs + (q + 2 * kv) * e)
}

struct BackwardSet {
    /// q, k, v, o, d_o, dq, dk, dv: held so the pointers stay valid.
    _bufs: Vec<CudaSlice<u16>>,
    _lse: CudaSlice<f32>,
    ptrs: BackwardPtrs,
}

/// `sets` buffer sets for one shape, one backward plan (its workspace is reused by every call:
/// they run one after another on the context's stream) and, for forward+backward, one forward
/// plan per set (as the forward's launcher keeps them).
pub struct BackwardLauncher {
    backward: BackwardPlan,
    forward: Vec<Plan>,
    with_forward: bool,
    sets: Vec<BackwardSet>,
}

impl BackwardLauncher {
    pub fn new(
        ctx: &Context,
        p: &AttentionParams,
        sets: usize,
        seed: u64,
        with_forward: bool,
    ) -> Result<Self> {
        let stream = ctx.stream();
        let backward = ctx.plan_backward(p)?;
        let mut bufs = Vec::with_capacity(sets);
        let mut forward = Vec::with_capacity(sets);
        for s in 0..sets.max(1) {
            let base = seed.wrapping_add((s as u64) << 8);
            let rand =
                |len: usize, off: u64| stream.clone_htod(&random_bits(p.dtype, len, base + off));
            let (q, k, v, d_o) = (
                rand(p.q_len(), 0)?,
                rand(p.kv_len(), 1)?,
                rand(p.kv_len(), 2)?,
                rand(p.q_len(), 3)?,
            );
            let o = stream.alloc_zeros::<u16>(p.q_len())?;
            let dq = stream.alloc_zeros::<u16>(p.q_len())?;
            let dk = stream.alloc_zeros::<u16>(p.kv_len())?;
            let dv = stream.alloc_zeros::<u16>(p.kv_len())?;
            let lse = stream.alloc_zeros::<f32>(p.lse_len())?;
            let ptr = |b: &CudaSlice<u16>| b.device_ptr(stream).0;
            let ptrs = BackwardPtrs {
                q: ptr(&q),
                k: ptr(&k),
                v: ptr(&v),
                o: ptr(&o),
                lse: lse.device_ptr(stream).0,
                d_o: ptr(&d_o),
                dq: ptr(&dq),
                dk: ptr(&dk),
                dv: ptr(&dv),
                sinks: 0,
                dsink: 0,
            };
            let plan = ctx.plan(p)?;
            // SAFETY: every buffer was allocated above for exactly this shape and dtype (cudarc
            // allocations are 256-byte aligned) and lives in `bufs` as long as the launcher.
            unsafe { plan.launch_raw(ptrs.q, ptrs.k, ptrs.v, ptrs.o, ptrs.lse) }?;
            if with_forward {
                forward.push(plan);
            }
            bufs.push(BackwardSet {
                _bufs: vec![q, k, v, o, d_o, dq, dk, dv],
                _lse: lse,
                ptrs,
            });
        }
        stream.synchronize()?;
        Ok(BackwardLauncher {
            backward,
            forward,
            with_forward,
            sets: bufs,
        })
    }
}

impl Launcher for BackwardLauncher {
    fn sets(&self) -> usize {
        self.sets.len()
    }

    fn launch(&mut self, set: usize) -> Result<()> {
        let ptrs = &self.sets[set].ptrs;
        // SAFETY: the set's buffers match the plans' shape and dtype (made in `new`), live as
        // long as `self`, and every launch is on the context's one stream.
        unsafe {
            if self.with_forward {
                self.forward[set].launch_raw(ptrs.q, ptrs.k, ptrs.v, ptrs.o, ptrs.lse)?;
            }
            self.backward.launch_raw(ptrs)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_counts_what_the_backward_reads_and_writes() {
        let mut p = AttentionParams::new(2, 8, 100, 64).seqlen_k(300);
        p.heads_kv = 2;
        let (q, kv) = (2 * 100 * 8 * 64, 2 * 300 * 2 * 64);
        let (inputs, total) = set_bytes(&p);
        assert_eq!(inputs, (3 * q + 2 * kv) * 2 + 4 * 2 * 8 * 100);
        assert_eq!(total, inputs + (q + 2 * kv) * 2);
    }
}
