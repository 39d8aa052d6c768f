//! Secret lengths with varlen: a pack of self-attention sequences whose **slots** are
//! public (`cu_seqlens`: sequence b owns packed rows `cu[b] .. cu[b + 1]`, docs/design.md §1
//! metadata) and whose **true lengths** are secret (`lengths[b]`, i32 on the device, the first
//! `lengths[b]` rows of the slot are the sequence, the rest of the slot is padding).
//!
//! Built from parts that exist, with no kernel of its own: the slots are gathered into a dense
//! padded batch `[batch, max_seqlen, heads, head_dim]` (zeros past each slot), the dense
//! secret-length kernel runs over it with the secret lengths (it walks `max_seqlen` and masks by
//! select, docs/security.md), and each slot's rows are copied back into the packed output. Every
//! gather and scatter is a device-to-device copy whose address and size come from `cu_seqlens`
//! alone; no copy, launch or host branch reads a length. The cost is that of the dense padded
//! batch (`batch × max_seqlen`), whatever the slots' and the lengths' sizes.
//!
//! A kernel route (the varlen work list over slots, each tile's key limit and stored-row values
//! masked by a secret per-sequence length) would walk each slot instead of `max_seqlen`, but needs
//! the varlen builds to read a secret length per item (kernels/fc_config.cuh rules varlen and
//! secret lengths apart today, and the work item has no sequence index).

use crate::attention::call::{Call, Keys};
use crate::attention::context::{Context, Element};
use crate::attention::launch::varlen::{check_cu_seqlens, check_varlen_shapes};
use crate::attention::validate;
use crate::error::{Error, Result};
use crate::spec::AttentionParams;
use cudarc::driver::{sys, CudaSlice, DevicePtr, DevicePtrMut};

/// The public checks of a secret-length varlen call (no length is read): shapes as for a varlen
/// call, `seqlen_q == seqlen_k` (the slot bound `max_seqlen`, the dense batch's padded length),
/// k and v holding the same tokens as q (self-attention: one `cu_seqlens` for both), `cu` a
/// prefix sum of the pack with no slot longer than `max_seqlen`, `lengths` one entry per
/// sequence. Returns the packed token count.
pub fn check_varlen_secret_len(
    params: &AttentionParams,
    cu: &[i32],
    lengths_len: usize,
    q_len: usize,
    kv_len: [usize; 2],
    out_len: usize,
    lse_len: Option<usize>,
) -> Result<usize> {
    let (total_q, total_k) = check_varlen_shapes(params, q_len, kv_len, out_len, lse_len)?;
    validate::check_secret_len(params)?;
    // The dense secret-length kernel this path runs takes no softcap and no window.
    if params.softcap != 0.0 || !params.window.is_unbounded() {
        return Err(Error::invalid(
            if params.softcap != 0.0 {
                "softcap"
            } else {
                "window"
            },
            "is not supported with secret lengths yet",
        ));
    }
    if total_k != total_q {
        return Err(Error::invalid(
            "k",
            format!(
                "holds {total_k} tokens, q holds {total_q}: secret lengths with varlen are \
                 self-attention (one cu_seqlens for queries and keys)"
            ),
        ));
    }
    if lengths_len != params.batch {
        return Err(Error::invalid(
            "lengths",
            format!(
                "has {lengths_len} entries, a batch of {} sequences needs one each",
                params.batch
            ),
        ));
    }
    check_cu_seqlens("cu_seqlens", cu, params.batch, total_q, params.seqlen_q)?;
    Ok(total_q)
}

/// Enqueues a 2-D copy of `height` rows of `width` bytes from `src` (rows `src_pitch` apart) to
/// `dst` (rows `dst_pitch` apart), device to device, on `stream`.
///
/// # Safety
/// Both regions lie inside live device allocations until the copy ends.
unsafe fn copy_2d(
    stream: sys::CUstream,
    (dst, dst_pitch): (u64, usize),
    (src, src_pitch): (u64, usize),
    width: usize,
    height: usize,
) -> Result<()> {
    if width == 0 || height == 0 {
        return Ok(());
    }
    let c = copy_2d_desc((dst, dst_pitch), (src, src_pitch), width, height);
    sys::cuMemcpy2DAsync_v2(&c, stream).result()?;
    Ok(())
}

/// The driver's description of [`copy_2d`]'s copy. Every field written out: the struct holds
/// enums with no zero value (`mem::zeroed` of it is undefined behaviour, and panics).
fn copy_2d_desc(
    (dst, dst_pitch): (u64, usize),
    (src, src_pitch): (u64, usize),
    width: usize,
    height: usize,
) -> sys::CUDA_MEMCPY2D {
    sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: height,
    }
}

impl Context {
    /// Secret lengths with varlen: self-attention over a pack `q` `[total, heads_q, head_dim]`,
    /// `k`, `v` `[total, heads_kv, head_dim]` whose slots `cu_seqlens` (i32 `[batch + 1]` on the
    /// device, public: downloaded and checked here) are public and whose true lengths `lengths`
    /// (i32 `[batch]` on the device) are secret. Sequence b is the first `lengths[b]` tokens of
    /// its slot `cu_seqlens[b] .. cu_seqlens[b + 1]`, for queries and keys alike; causal means
    /// query i of the sequence sees its keys 0..=i (top-left and bottom-right agree: equal
    /// lengths). Rows of `out` from `lengths[b]` to the slot's end are 0 (`lse` −inf), written
    /// by select, as the dense secret-length mode does.
    ///
    /// `params`: `batch` sequences, `seqlen_q == seqlen_k` the slot bound `max_seqlen` (the
    /// padded length of the dense batch that runs), heads, head dim, dtype, causal, scale;
    /// layout `Bshd`; no window or softcap. `lse` is fp32 `[heads_q, total]` as for
    /// [`Context::attention_varlen`].
    ///
    /// Contract: `0 ≤ lengths[b] ≤` slot size. The lengths are never read on the host; the kernel
    /// clamps each to `[0, max_seqlen]`, so a length past its slot gives that sequence wrong rows
    /// (it attends to the zero padding past the slot) but no access outside the buffers and no
    /// change to its neighbours. Time, control flow and addresses depend on `batch`,
    /// `max_seqlen`, the slots (`cu_seqlens`), heads, head dim, dtype and causal — not on the
    /// lengths nor on any tensor value.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_varlen_secret_len<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        cu_seqlens: &CudaSlice<i32>,
        lengths: &CudaSlice<i32>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let keys = Keys::VarlenSecretLen {
            k,
            v,
            cu_seqlens,
            lengths,
        };
        self.run(&Call::new(params, q, keys), out, lse)
    }

    /// Secret-length varlen ([`Keys::VarlenSecretLen`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn varlen_secret_len<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        cu_seqlens: &CudaSlice<i32>,
        lengths: &CudaSlice<i32>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        validate::check_buffers_dtype(params, T::DTYPE)?;
        let cu = self.download(cu_seqlens)?;
        let total = check_varlen_secret_len(
            params,
            &cu,
            lengths.len(),
            q.len(),
            [k.len(), v.len()],
            out.len(),
            lse.as_ref().map(|l| l.len()),
        )?;
        if total == 0 {
            return Ok(()); // no row anywhere: nothing to write
        }
        let p = params;
        let s = p.seqlen_q;
        let es = p.dtype.size();
        let row_q = p.heads_q * p.head_dim * es;
        let row_k = p.heads_kv * p.head_dim * es;
        // The dense padded batch, zero past every slot (finite: masked keys meet P = 0).
        let q_pad = self.alloc::<T>(p.q_len())?;
        let k_pad = self.alloc::<T>(p.kv_len())?;
        let v_pad = self.alloc::<T>(p.kv_len())?;
        let mut out_pad = self.alloc::<T>(p.q_len())?;
        let mut lse_pad = match lse {
            Some(_) => Some(self.alloc::<f32>(p.lse_len())?),
            None => None,
        };
        let stream = self.stream().clone();
        let cs = stream.cu_stream();
        let slot = |b: usize| (cu[b] as usize, (cu[b + 1] - cu[b]) as usize);
        {
            let (qs, _g1) = q.device_ptr(&stream);
            let (ks, _g2) = k.device_ptr(&stream);
            let (vs, _g3) = v.device_ptr(&stream);
            let (qd, _g4) = q_pad.device_ptr(&stream);
            let (kd, _g5) = k_pad.device_ptr(&stream);
            let (vd, _g6) = v_pad.device_ptr(&stream);
            for b in 0..p.batch {
                let (start, size) = slot(b);
                for (src, dst, row) in [(qs, qd, row_q), (ks, kd, row_k), (vs, vd, row_k)] {
                    // SAFETY: the slot lies inside the pack (cu checked against `total`) and
                    // row b of the dense batch holds `s ≥ size` rows (checked: max_seqlen).
                    unsafe {
                        copy_2d(
                            cs,
                            (dst + (b * s * row) as u64, row),
                            (src + (start * row) as u64, row),
                            row,
                            size,
                        )?
                    };
                }
            }
        }
        self.attention_secret_len(
            p,
            &q_pad,
            &k_pad,
            &v_pad,
            &mut out_pad,
            lse_pad.as_mut(),
            lengths,
        )?;
        let (os, _g1) = out_pad.device_ptr(&stream);
        let (od, _g2) = out.device_ptr_mut(&stream);
        for b in 0..p.batch {
            let (start, size) = slot(b);
            // SAFETY: as for the gather, in the other direction.
            unsafe {
                copy_2d(
                    cs,
                    (od + (start * row_q) as u64, row_q),
                    (os + (b * s * row_q) as u64, row_q),
                    row_q,
                    size,
                )?
            };
        }
        if let (Some(l), Some(lp)) = (lse, lse_pad.as_ref()) {
            // Dense LSE is [batch, heads_q, s]; the pack's is [heads_q, total]: per sequence,
            // heads_q rows of `size` floats.
            let (ls, _g3) = lp.device_ptr(&stream);
            let (ld, _g4) = l.device_ptr_mut(&stream);
            for b in 0..p.batch {
                let (start, size) = slot(b);
                // SAFETY: rows h·s of the dense LSE and h·total of the packed one, `size ≤ s`
                // floats each, for h < heads_q.
                unsafe {
                    copy_2d(
                        cs,
                        (ld + (start * 4) as u64, total * 4),
                        (ls + (b * p.heads_q * s * 4) as u64, s * 4),
                        size * 4,
                        p.heads_q,
                    )?
                };
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::validate::rule_of;
    use crate::spec::Layout;

    fn p() -> AttentionParams {
        AttentionParams::new(3, 2, 8, 64)
    }

    fn check(
        p: &AttentionParams,
        cu: &[i32],
        lens: usize,
        q: usize,
        kv: [usize; 2],
        out: usize,
        lse: Option<usize>,
    ) -> std::result::Result<usize, (String, String)> {
        check_varlen_secret_len(p, cu, lens, q, kv, out, lse).map_err(|e| {
            let (a, r) = rule_of(e);
            (a.to_string(), r)
        })
    }

    #[test]
    fn copy_descriptions_are_device_to_device() {
        let c = copy_2d_desc((0x2000, 400), (0x1000, 40), 36, 3);
        assert_eq!(
            (c.dstDevice, c.dstPitch, c.srcDevice, c.srcPitch),
            (0x2000, 400, 0x1000, 40)
        );
        assert_eq!(
            (c.WidthInBytes, c.Height, c.srcXInBytes, c.dstY),
            (36, 3, 0, 0)
        );
        assert_eq!(c.srcMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(c.dstMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert!(c.srcHost.is_null() && c.dstHost.is_null());
        assert!(c.srcArray.is_null() && c.dstArray.is_null());
    }

    #[test]
    fn accepts_a_pack_of_slots() {
        let row = 2 * 64;
        let cu = [0, 8, 8, 13];
        assert_eq!(
            check(&p(), &cu, 3, 13 * row, [13 * row; 2], 13 * row, Some(26)).unwrap(),
            13
        );
    }

    #[test]
    #[allow(clippy::type_complexity)]
    fn each_error_names_its_argument() {
        let row = 2 * 64;
        let cu = [0, 8, 8, 13];
        let n = 13 * row;
        let cases: Vec<(
            AttentionParams,
            Vec<i32>,
            usize,
            usize,
            [usize; 2],
            usize,
            &str,
            &str,
        )> = vec![
            (
                p().seqlen_k(9),
                cu.to_vec(),
                3,
                n,
                [n; 2],
                n,
                "seqlen_k",
                "seqlen_q == seqlen_k",
            ),
            (
                p(),
                cu.to_vec(),
                3,
                n,
                [12 * row; 2],
                n,
                "k",
                "self-attention",
            ),
            (
                p(),
                cu.to_vec(),
                2,
                n,
                [n; 2],
                n,
                "lengths",
                "has 2 entries",
            ),
            (
                p(),
                vec![0, 8, 7, 13],
                3,
                n,
                [n; 2],
                n,
                "cu_seqlens",
                "non-decreasing",
            ),
            (
                p(),
                vec![0, 9, 9, 13],
                3,
                n,
                [n; 2],
                n,
                "cu_seqlens",
                "more than max_seqlen",
            ),
            (
                p(),
                vec![0, 8, 13],
                3,
                n,
                [n; 2],
                n,
                "cu_seqlens",
                "batch + 1",
            ),
            (
                p(),
                vec![0, 8, 8, 12],
                3,
                n,
                [n; 2],
                n,
                "cu_seqlens",
                "last entry",
            ),
            (p(), cu.to_vec(), 3, n, [n; 2], n - row, "out", "q has"),
            (
                p(),
                cu.to_vec(),
                3,
                n + 1,
                [n; 2],
                n + 1,
                "q",
                "whole number",
            ),
            (
                p().layout(Layout::Bhsd),
                cu.to_vec(),
                3,
                n,
                [n; 2],
                n,
                "layout",
                "packed",
            ),
            (
                p().softcap(5.0),
                cu.to_vec(),
                3,
                n,
                [n; 2],
                n,
                "softcap",
                "secret lengths",
            ),
            (
                p().window(crate::attention::Window::from_flash_attn(4, 0)),
                cu.to_vec(),
                3,
                n,
                [n; 2],
                n,
                "window",
                "secret lengths",
            ),
        ];
        for (params, cu, lens, q, kv, out, arg, rule) in cases {
            let (a, r) = check(&params, &cu, lens, q, kv, out, None).unwrap_err();
            assert_eq!(a, arg, "{rule}: {r}");
            assert!(r.contains(rule), "{arg}: {r}");
        }
        let (a, _) = check(&p(), &cu, 3, n, [n; 2], n, Some(25)).unwrap_err();
        assert_eq!(a, "lse");
    }
}
