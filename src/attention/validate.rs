//! Every rule a call must meet, checked on the host before anything is launched.

use crate::error::{Error, Result};
use crate::spec::limits::head_dim_list;
pub use crate::spec::limits::{BACKWARD_HEAD_DIMS, SUPPORTED_HEAD_DIMS, TENSOR_ALIGN};
use crate::spec::{AttentionParams, DType, Pages, MAX_SEQLEN_Q, MIN_PAGE_SIZE};

/// The backward's head-dim rule (check_backward_params): a head dim without backward kernels.
pub fn check_backward_head_dim(p: &AttentionParams) -> Result<()> {
    if !BACKWARD_HEAD_DIMS.contains(&p.head_dim) {
        return Err(Error::invalid(
            "head_dim",
            format!(
                "{} has no backward (gradients: head dims {})",
                p.head_dim,
                head_dim_list(&BACKWARD_HEAD_DIMS)
            ),
        ));
    }
    Ok(())
}

/// The tensor-map fields cap extents and strides.
const TMA_MAX_DIM: usize = 1 << 31;

/// Checks the shape-level rules (no buffers involved).
pub fn check_params(p: &AttentionParams) -> Result<()> {
    for (name, v) in [
        ("batch", p.batch),
        ("seqlen_q", p.seqlen_q),
        ("seqlen_k", p.seqlen_k),
        ("heads_q", p.heads_q),
        ("heads_kv", p.heads_kv),
        ("head_dim", p.head_dim),
    ] {
        if v == 0 {
            return Err(Error::invalid(
                name,
                "must be at least 1 (zero-sized dimensions are not allowed)",
            ));
        }
        if v >= TMA_MAX_DIM {
            return Err(Error::invalid(
                name,
                format!("{v} exceeds the TMA extent limit of 2^31"),
            ));
        }
    }
    if !SUPPORTED_HEAD_DIMS.contains(&p.head_dim) {
        return Err(Error::invalid(
            "head_dim",
            format!(
                "{} is not supported (supported: {})",
                p.head_dim,
                head_dim_list(&SUPPORTED_HEAD_DIMS)
            ),
        ));
    }
    if p.heads_q % p.heads_kv != 0 {
        return Err(Error::invalid(
            "heads_kv",
            format!(
                "heads_q ({}) must be a multiple of heads_kv ({})",
                p.heads_q, p.heads_kv
            ),
        ));
    }
    if let Some(s) = p.scale {
        // The online softmax subtracts the running max of raw scores, which is the max of the
        // scaled scores only for a positive scale.
        if !s.is_finite() || s <= 0.0 {
            return Err(Error::invalid(
                "scale",
                format!("must be positive and finite, got {s}"),
            ));
        }
    }
    if !p.softcap.is_finite() || p.softcap < 0.0 {
        return Err(Error::invalid(
            "softcap",
            format!("must be 0 (off) or positive and finite, got {}", p.softcap),
        ));
    }
    // Total elements must fit the kernels' 64-bit offsets and TMA's 2^40-byte stride limit.
    // Computed in u128: the product of four dimensions below 2^31 can overflow usize.
    let bytes = |s: usize, h: usize| {
        p.batch as u128 * s as u128 * h as u128 * p.head_dim as u128 * p.dtype.size() as u128
    };
    let biggest = bytes(p.seqlen_q, p.heads_q).max(bytes(p.seqlen_k, p.heads_kv));
    if biggest >= (1u128 << 40) {
        return Err(Error::invalid(
            "batch",
            "tensor larger than 2^40 bytes cannot be addressed by TMA",
        ));
    }
    Ok(())
}

/// Secret-length mode pads queries and keys to one public length; each batch entry's true
/// length applies to both.
pub fn check_secret_len(p: &AttentionParams) -> Result<()> {
    if p.seqlen_q != p.seqlen_k {
        return Err(Error::invalid(
            "seqlen_k",
            format!(
                "secret-length mode needs seqlen_q == seqlen_k (the padded length), got {} and {}",
                p.seqlen_q, p.seqlen_k
            ),
        ));
    }
    Ok(())
}

/// KV-cache mode: a few new queries (decode, speculative verification) over a cache.
pub fn check_kv_cache(p: &AttentionParams) -> Result<()> {
    let max = MAX_SEQLEN_Q;
    if p.seqlen_q > max {
        return Err(Error::invalid(
            "seqlen_q",
            format!(
                "a KV-cache call takes at most {max} query positions per sequence, got {}",
                p.seqlen_q
            ),
        ));
    }
    Ok(())
}

/// A paged cache's geometry against the shape: pages of at least one row (any size: powers of
/// two of at least 16 rows load as TMA boxes, others are gathered), a capacity (`seqlen_k`) that
/// is a whole number of pages, a pool the kernel can index in i32, and the bshd layout (pools
/// are `[num_pages, page_size, heads_kv, head_dim]`).
pub fn check_pages(p: &AttentionParams, pages: &Pages) -> Result<()> {
    let min = MIN_PAGE_SIZE;
    if pages.page_size < min || pages.page_size > i32::MAX as usize {
        return Err(Error::invalid(
            "page_size",
            format!(
                "must be at least {min} row and below 2^31, got {}",
                pages.page_size
            ),
        ));
    }
    if p.seqlen_k % pages.page_size != 0 {
        return Err(Error::invalid(
            "seqlen_k",
            format!(
                "a paged cache's capacity is its block table's row length times the page size: {} is not a multiple of {}",
                p.seqlen_k, pages.page_size
            ),
        ));
    }
    if pages.num_pages == 0 || pages.num_pages > i32::MAX as usize {
        return Err(Error::invalid(
            "num_pages",
            format!(
                "the pool must hold 1 to 2^31 - 1 pages, got {}",
                pages.num_pages
            ),
        ));
    }
    if p.layout != crate::spec::Layout::Bshd {
        return Err(Error::invalid(
            "layout",
            "paged caches are [num_pages, page_size, heads_kv, head_dim] (bshd)",
        ));
    }
    Ok(())
}

/// A KV cache's first keys (flash-attn's `cache_leftpad`): one per sequence; with public counts
/// each within [0, its count] (the kernel clamps whatever a secret one holds).
pub fn check_kv_starts(counts: &[i32], starts: &[i32], secret: bool) -> Result<()> {
    if starts.len() != counts.len() {
        return Err(Error::invalid(
            "cache_leftpad",
            format!("has {} entries, batch is {}", starts.len(), counts.len()),
        ));
    }
    if !secret {
        for (b, (&s, &n)) in starts.iter().zip(counts).enumerate() {
            if s < 0 || s > n {
                return Err(Error::invalid(
                    "cache_leftpad",
                    format!("sequence {b} starts at key {s}, outside [0, its count {n}]"),
                ));
            }
        }
    }
    Ok(())
}

/// The public metadata of a KV-cache call, read back on the host: every key count within the
/// capacity, and every block-table entry a sequence's keys use inside the pool (all entries when
/// the counts are secret, since the kernel then walks the whole table). `counts` are the key
/// counts after any append; `table` is `[batch, seqlen_k / page_size]`.
pub fn check_kv_metadata(
    p: &AttentionParams,
    counts: &[i32],
    table: Option<(&[i32], &Pages)>,
    secret: bool,
) -> Result<()> {
    if counts.len() != p.batch {
        return Err(Error::invalid(
            "seqlens_k",
            format!("has {} entries, batch is {}", counts.len(), p.batch),
        ));
    }
    if !secret {
        for (b, &n) in counts.iter().enumerate() {
            if n < 0 || n as usize > p.seqlen_k {
                return Err(Error::invalid(
                    "seqlens_k",
                    format!(
                        "sequence {b} has {n} keys, outside [0, the capacity {}]",
                        p.seqlen_k
                    ),
                ));
            }
        }
    }
    if let Some((table, pages)) = table {
        let stride = p.seqlen_k / pages.page_size;
        if table.len() != p.batch * stride {
            return Err(Error::invalid(
                "block_table",
                format!(
                    "has {} entries, [batch, seqlen_k / page_size] needs {}",
                    table.len(),
                    p.batch * stride
                ),
            ));
        }
        for (b, row) in table.chunks(stride.max(1)).enumerate() {
            let used = if secret {
                stride
            } else {
                (counts[b].max(0) as usize).div_ceil(pages.page_size)
            };
            for (slot, &page) in row.iter().take(used).enumerate() {
                if page < 0 || page as usize >= pages.num_pages {
                    return Err(Error::invalid(
                        "block_table",
                        format!(
                            "sequence {b}, slot {slot}: page {page} is outside the pool of {} pages",
                            pages.num_pages
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The buffers' element type (`T::DTYPE` of a typed call) against the one the params name.
pub fn check_buffers_dtype(params: &AttentionParams, buffers: DType) -> Result<()> {
    if params.dtype != buffers {
        return Err(Error::invalid(
            "dtype",
            format!(
                "params say {} but the buffers hold {}",
                params.dtype.name(),
                buffers.name()
            ),
        ));
    }
    Ok(())
}

/// Checks one buffer's length and its base address alignment.
pub fn check_buffer(
    arg: &'static str,
    len: usize,
    expected: usize,
    addr: u64,
    align: usize,
) -> Result<()> {
    if len != expected {
        return Err(Error::invalid(
            arg,
            format!("has {len} elements, the shape needs {expected}"),
        ));
    }
    if addr as usize % align != 0 {
        return Err(Error::invalid(
            arg,
            format!("device address {addr:#x} is not {align}-byte aligned (TMA needs it)"),
        ));
    }
    Ok(())
}

/// A unit test's view of an expected invalid-argument error: which argument, and the rule.
#[cfg(test)]
pub(crate) fn rule_of(e: Error) -> (&'static str, String) {
    match e {
        Error::InvalidArgument { arg, rule } => (arg, rule),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// The argument a call's expected invalid-argument error names.
#[cfg(test)]
pub(crate) fn arg_of(r: Result<()>) -> &'static str {
    match r {
        Err(Error::InvalidArgument { arg, .. }) => arg,
        other => panic!("expected an invalid-argument error, got {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softcap_must_be_zero_or_positive_and_finite() {
        let p = AttentionParams::new(1, 2, 8, 64);
        assert!(check_params(&p.clone().softcap(0.0)).is_ok());
        assert!(check_params(&p.clone().softcap(50.0)).is_ok());
        for bad in [-1.0f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let (arg, rule) = rule_of(check_params(&p.clone().softcap(bad)).unwrap_err());
            assert_eq!(arg, "softcap");
            assert!(rule.contains("positive and finite"), "{rule}");
        }
    }

    #[test]
    fn the_backward_takes_windows_and_softcap_but_the_one_pass_kernel_refuses_them() {
        use crate::attention::backward::{check_backward_params, check_backward_variant};
        use crate::attention::Window;
        use crate::kernels::backward::BwdVariant;
        let p = AttentionParams::new(1, 2, 8, 64);
        assert!(check_backward_params(&p).is_ok());
        // Causal is the window (None, 0): still plain causal, no window variant.
        let causal = p
            .clone()
            .causal(true)
            .window(Window::from_flash_attn(-1, 0));
        assert!(check_backward_params(&causal).is_ok());
        assert!(!crate::kernels::select::backward(&causal).window);
        let win = p.clone().window(Window::from_flash_attn(4, 0));
        let cap = p.clone().softcap(5.0);
        for q in [&win, &cap] {
            assert!(check_backward_params(q).is_ok());
            let v = crate::kernels::select::backward(q);
            assert!(v.window && !v.onepass, "{v:?}");
            assert!(check_backward_variant(v).is_ok());
        }
        assert!(crate::kernels::select::backward(&cap).softcap);
        // FLASHCORE_BWD_ONEPASS=1 would pick the one-pass kernel: it has neither feature.
        for (q, arg) in [(&win, "window"), (&cap, "softcap")] {
            let one = BwdVariant {
                onepass: true,
                pingpong: false,
                ..crate::kernels::select::backward(q)
            };
            let e = check_backward_variant(one).unwrap_err();
            assert!(e.to_string().contains("one-pass"), "{e}");
            assert_eq!(arg_of(Err(e)), arg);
        }
    }
    use crate::spec::AttentionParams;

    #[test]
    fn accepts_supported_shapes() {
        check_params(&AttentionParams::new(2, 4, 17, 64)).unwrap();
        check_params(
            &AttentionParams::new(1, 1, 1, 128)
                .seqlen_k(1000)
                .causal(true),
        )
        .unwrap();
    }

    #[test]
    fn rejects_each_zero_dim() {
        let base = AttentionParams::new(1, 2, 8, 64);
        let cases: Vec<(&str, AttentionParams)> = vec![
            (
                "batch",
                AttentionParams {
                    batch: 0,
                    ..base.clone()
                },
            ),
            (
                "seqlen_q",
                AttentionParams {
                    seqlen_q: 0,
                    ..base.clone()
                },
            ),
            (
                "seqlen_k",
                AttentionParams {
                    seqlen_k: 0,
                    ..base.clone()
                },
            ),
            (
                "heads_q",
                AttentionParams {
                    heads_q: 0,
                    ..base.clone()
                },
            ),
            (
                "heads_kv",
                AttentionParams {
                    heads_kv: 0,
                    ..base.clone()
                },
            ),
            (
                "head_dim",
                AttentionParams {
                    head_dim: 0,
                    ..base.clone()
                },
            ),
        ];
        for (name, p) in cases {
            let (arg, rule) = rule_of(check_params(&p).unwrap_err());
            assert_eq!(arg, name);
            assert!(rule.contains("at least 1"), "{rule}");
        }
    }

    #[test]
    fn rejects_unsupported_head_dim() {
        let unsupported = [8, 80, 112, 160, 192, 512]
            .into_iter()
            .filter(|d| !crate::spec::SUPPORTED_HEAD_DIMS.contains(d));
        for d in unsupported {
            let (arg, rule) = rule_of(check_params(&AttentionParams::new(1, 1, 8, d)).unwrap_err());
            assert_eq!(arg, "head_dim");
            assert!(rule.contains(&d.to_string()), "{rule}");
        }
        for d in crate::spec::SUPPORTED_HEAD_DIMS {
            check_params(&AttentionParams::new(1, 1, 8, d)).unwrap();
        }
    }

    #[test]
    fn the_backward_serves_every_forward_head_dim_and_refuses_others() {
        use crate::attention::backward::check_backward_params;
        let unsupported = [80, 160, 192]
            .into_iter()
            .filter(|d| !crate::spec::SUPPORTED_HEAD_DIMS.contains(d));
        for d in unsupported {
            let p = AttentionParams::new(1, 2, 8, d);
            let (arg, _) = rule_of(check_backward_params(&p).unwrap_err());
            assert_eq!(arg, "head_dim");
            // The backward's own rule, past the forward's.
            let (arg, rule) = rule_of(check_backward_head_dim(&p).unwrap_err());
            assert_eq!(arg, "head_dim");
            assert!(
                rule.contains(&d.to_string()) && rule.contains("no backward"),
                "{rule}"
            );
        }
        for d in crate::spec::SUPPORTED_HEAD_DIMS {
            check_backward_params(&AttentionParams::new(1, 2, 8, d)).unwrap();
        }
    }

    #[test]
    fn rejects_heads_not_multiple() {
        let p = AttentionParams {
            heads_q: 6,
            heads_kv: 4,
            ..AttentionParams::new(1, 6, 8, 64)
        };
        let (arg, rule) = rule_of(check_params(&p).unwrap_err());
        assert_eq!(arg, "heads_kv");
        assert!(rule.contains("multiple"));
    }

    #[test]
    fn rejects_non_finite_or_non_positive_scale() {
        for s in [f32::NAN, f32::INFINITY, 0.0, -0.5] {
            let (arg, _) =
                rule_of(check_params(&AttentionParams::new(1, 1, 8, 64).scale(s)).unwrap_err());
            assert_eq!(arg, "scale");
        }
    }

    #[test]
    fn rejects_huge_tensors() {
        let p = AttentionParams::new(1 << 20, 1 << 10, 1 << 10, 128);
        let (arg, _) = rule_of(check_params(&p).unwrap_err());
        assert_eq!(arg, "batch");
    }

    #[test]
    fn secret_len_needs_equal_lengths() {
        check_secret_len(&AttentionParams::new(2, 2, 100, 64)).unwrap();
        let (arg, rule) = rule_of(
            check_secret_len(&AttentionParams::new(2, 2, 100, 64).seqlen_k(99)).unwrap_err(),
        );
        assert_eq!(arg, "seqlen_k");
        assert!(rule.contains("secret-length"));
    }

    #[test]
    fn buffer_length_and_alignment() {
        check_buffer("q", 10, 10, 0x1000, 16).unwrap();
        let (arg, rule) = rule_of(check_buffer("k", 9, 10, 0x1000, 16).unwrap_err());
        assert_eq!(arg, "k");
        assert!(rule.contains("9 elements"));
        let (arg, rule) = rule_of(check_buffer("v", 10, 10, 0x1008, 16).unwrap_err());
        assert_eq!(arg, "v");
        assert!(rule.contains("aligned"));
    }

    /// Each rule of a paged cache's geometry, one failing case each, and a good one.
    #[test]
    fn page_geometry_rules() {
        let p = AttentionParams::new(2, 2, 1, 64).seqlen_k(64);
        let pages = |page_size, num_pages| Pages {
            page_size,
            num_pages,
        };
        // Any page size dividing the capacity: powers of two (TMA boxes) and others (gathered).
        for page in [1, 2, 4, 8, 16, 32, 64] {
            check_pages(&p, &pages(page, 4)).unwrap();
        }
        let p21 = AttentionParams::new(2, 2, 1, 64).seqlen_k(21);
        for page in [1, 3, 7, 21] {
            check_pages(&p21, &pages(page, 4)).unwrap();
        }
        let cases = [
            (p.clone(), pages(0, 4), "page_size", "at least 1 row"),
            (p.clone(), pages(1 << 31, 4), "page_size", "below 2^31"),
            (p.clone(), pages(128, 4), "seqlen_k", "not a multiple"),
            (p.clone(), pages(24, 4), "seqlen_k", "not a multiple"),
            (
                p.clone(),
                pages(7, 4),
                "seqlen_k",
                "64 is not a multiple of 7",
            ),
            (
                p21.clone(),
                pages(2, 4),
                "seqlen_k",
                "21 is not a multiple of 2",
            ),
            (p.clone(), pages(16, 0), "num_pages", "1 to 2^31 - 1"),
            (p.clone(), pages(16, 1 << 31), "num_pages", "1 to 2^31 - 1"),
            (
                p.clone().layout(crate::spec::Layout::Bhsd),
                pages(16, 4),
                "layout",
                "bshd",
            ),
        ];
        for (q, pg, want_arg, want) in cases {
            let (arg, rule) = rule_of(check_pages(&q, &pg).unwrap_err());
            assert_eq!(arg, want_arg, "{pg:?}: {rule}");
            assert!(rule.contains(want), "{pg:?}: {rule}");
        }
    }

    /// Each rule of the counts and the block table: a page outside the pool (past it or negative)
    /// in a slot a sequence uses is refused; the same in a slot past its keys is not read and is
    /// accepted, unless the counts are secret (the kernel then walks every slot).
    #[test]
    fn kv_metadata_rules() {
        let p = AttentionParams::new(2, 2, 1, 64).seqlen_k(32);
        let pg = Pages {
            page_size: 16,
            num_pages: 4,
        };
        let ok = |counts: &[i32], table: &[i32], secret| {
            check_kv_metadata(&p, counts, Some((table, &pg)), secret)
        };
        ok(&[20, 32], &[0, 1, 2, 3], false).unwrap();
        ok(&[0, 32], &[9, -3, 2, 3], false).unwrap();
        ok(&[5, 16], &[0, 9, 2, -3], false).unwrap();
        check_kv_metadata(&p, &[0, 32], None, false).unwrap();
        // Secret counts are not checked against the capacity (the kernel clamps them).
        check_kv_metadata(&p, &[-1, 99], None, true).unwrap();
        // (counts, table, secret, the argument named, part of the message)
        type Case<'a> = (&'a [i32], &'a [i32], bool, &'a str, &'a str);
        let cases: [Case; 8] = [
            (&[5], &[0, 1, 2, 3], false, "seqlens_k", "batch is 2"),
            (&[5, 6, 7], &[0, 1, 2, 3], false, "seqlens_k", "batch is 2"),
            (&[-1, 5], &[0, 1, 2, 3], false, "seqlens_k", "outside [0"),
            (&[5, 33], &[0, 1, 2, 3], false, "seqlens_k", "outside [0"),
            (&[5, 6], &[0, 1, 2], false, "block_table", "needs 4"),
            (&[5, 17], &[0, 1, 2, 9], false, "block_table", "page 9"),
            (&[5, 6], &[0, 1, -3, 3], false, "block_table", "page -3"),
            (&[0, 0], &[0, 9, 2, 3], true, "block_table", "page 9"),
        ];
        for (counts, table, secret, want_arg, want) in cases {
            let (arg, rule) = rule_of(ok(counts, table, secret).unwrap_err());
            assert_eq!(arg, want_arg, "{counts:?} {table:?}: {rule}");
            assert!(rule.contains(want), "{counts:?} {table:?}: {rule}");
        }
    }

    #[test]
    fn kv_starts_rules() {
        check_kv_starts(&[5, 9], &[0, 9], false).unwrap();
        check_kv_starts(&[5, 9], &[-4, 99], true).unwrap();
        for (starts, secret, want) in [
            (&[0][..], false, "batch is 2"),
            (&[0, 0, 0][..], true, "batch is 2"),
            (&[-1, 0][..], false, "outside [0"),
            (&[0, 10][..], false, "outside [0"),
        ] {
            let (arg, rule) = rule_of(check_kv_starts(&[5, 9], starts, secret).unwrap_err());
            assert_eq!(arg, "cache_leftpad");
            assert!(rule.contains(want), "{starts:?}: {rule}");
        }
    }
}
