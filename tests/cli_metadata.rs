//! The metadata of `flashcore attn`'s KV-cache and varlen input files (`block_table`,
//! `cache_seqlens`, `cu_seqlens_q`, `cu_seqlens_k`) is checked on the host before anything runs,
//! on the CPU path and the GPU path alike: each rule by a file that breaks it, then random
//! metadata (proptest) that must give exit 0 exactly when an independent statement of the rules
//! holds, and otherwise one `flashcore: error:` line with exit 1 — never a panic — and the same
//! error without `--cpu` (where the metadata is good, the GPU path runs when there is a GPU).

mod common;

use proptest::prelude::*;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::{Path, PathBuf};

const HQ: usize = 2;
const HKV: usize = 1;
const D: usize = 64;
const PAGE: usize = 16;
const POOL: usize = 4;

/// One tensor of an input file: name, dtype, shape, little-endian bytes.
type Entry = (String, Dtype, Vec<usize>, Vec<u8>);

fn i32s(name: &str, shape: Vec<usize>, x: &[i32]) -> Entry {
    let bytes = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    (name.into(), Dtype::I32, shape, bytes)
}

/// A bf16 tensor of `shape` with deterministic small values.
fn data(name: &str, shape: Vec<usize>) -> Entry {
    let n: usize = shape.iter().product();
    let bytes = (0..n)
        .flat_map(|i| half::bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 64.0).to_le_bytes())
        .collect();
    (name.into(), Dtype::BF16, shape, bytes)
}

fn write(dir: &Path, name: &str, entries: &[Entry]) -> PathBuf {
    let views: Vec<(&str, TensorView)> = entries
        .iter()
        .map(|(n, dt, shape, b)| (n.as_str(), TensorView::new(*dt, shape.clone(), b).unwrap()))
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    path
}

/// A paged KV-cache file: `batch` sequences of one query, a pool of [`POOL`] pages of [`PAGE`]
/// rows, the given table (`[batch, slots]`) and lengths, and `new` rows to append.
fn kv_file(
    dir: &Path,
    name: &str,
    batch: usize,
    table: (&[i32], usize),
    lens: &[i32],
    new: usize,
) -> PathBuf {
    let mut e = vec![
        data("q", vec![batch, 1, HQ, D]),
        data("k_cache", vec![POOL, PAGE, HKV, D]),
        data("v_cache", vec![POOL, PAGE, HKV, D]),
        i32s("cache_seqlens", vec![lens.len()], lens),
        i32s("block_table", vec![batch, table.1], table.0),
    ];
    if new > 0 {
        e.push(data("k", vec![batch, new, HKV, D]));
        e.push(data("v", vec![batch, new, HKV, D]));
    }
    write(dir, name, &e)
}

/// A varlen file: `total_q` query and `total_k` key tokens, and the two prefix sums.
fn varlen_file(
    dir: &Path,
    name: &str,
    cu_q: &[i32],
    cu_k: &[i32],
    totals: (usize, usize),
) -> PathBuf {
    write(
        dir,
        name,
        &[
            data("q", vec![totals.0, HQ, D]),
            data("k", vec![totals.1, HKV, D]),
            data("v", vec![totals.1, HKV, D]),
            i32s("cu_seqlens_q", vec![cu_q.len()], cu_q),
            i32s("cu_seqlens_k", vec![cu_k.len()], cu_k),
        ],
    )
}

/// Runs `flashcore attn` on `input` (with `--cpu` if asked); returns (exit code, stderr), and
/// fails on a panic or on an error that is not one `flashcore: error:` line.
fn attn(input: &Path, cpu: bool, extra: &[&str]) -> (i32, String) {
    let out = input.with_extension("out.safetensors");
    let mut args = vec![
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ];
    if cpu {
        args.push("--cpu");
    }
    args.extend_from_slice(extra);
    let r = common::flashcore_attn(&args);
    if r.code != 0 {
        assert_eq!(r.code, 1, "{}", r.stderr);
        assert!(
            r.stderr.starts_with("flashcore: error:") && r.stderr.trim_end().lines().count() == 1,
            "not one clear error line:\n{}",
            r.stderr
        );
    }
    (r.code, r.stderr)
}

fn expect_error(input: &Path, cpu: bool, want: &str) {
    let (code, stderr) = attn(input, cpu, &[]);
    assert_eq!(code, 1, "expected `{want}`, the call succeeded");
    assert!(stderr.contains(want), "expected `{want}` in: {stderr}");
}

/// A page outside the pool (past it, or negative) in a slot a sequence's keys use is refused,
/// on the CPU path and (before any device is touched) on the GPU path.
#[test]
fn a_used_slot_outside_the_pool_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for (i, page) in [9, 4, -3, -1, i32::MIN, i32::MAX].into_iter().enumerate() {
        let f = kv_file(
            dir.path(),
            &format!("t{i}.safetensors"),
            2,
            (&[0, 1, 2, page], 2),
            &[5, 20],
            0,
        );
        for cpu in [true, false] {
            expect_error(
                &f,
                cpu,
                &format!("page {page} is outside the pool of {POOL} pages"),
            );
        }
    }
}

/// Slots past a sequence's keys are never read: any value there gives the bits of a table whose
/// spare slots are valid pages (the pools' rows past a count are not gathered either).
#[test]
fn unused_slots_may_hold_anything() {
    let dir = tempfile::tempdir().unwrap();
    let good = kv_file(
        dir.path(),
        "good.safetensors",
        2,
        (&[0, 1, 2, 3], 2),
        &[5, 20],
        0,
    );
    let (code, stderr) = attn(&good, true, &["--causal"]);
    assert_eq!(code, 0, "{stderr}");
    let want = flashcore::tensor_io::read_file(&good.with_extension("out.safetensors")).unwrap();
    for (i, spare) in [9, -3, i32::MIN, i32::MAX].into_iter().enumerate() {
        let f = kv_file(
            dir.path(),
            &format!("s{i}.safetensors"),
            2,
            (&[0, spare, 2, 3], 2),
            &[5, 20],
            0,
        );
        let (code, stderr) = attn(&f, true, &["--causal"]);
        assert_eq!(code, 0, "spare slot {spare}: {stderr}");
        let got = flashcore::tensor_io::read_file(&f.with_extension("out.safetensors")).unwrap();
        assert_eq!(
            got["out"].data.to_f64(),
            want["out"].data.to_f64(),
            "spare slot {spare}"
        );
    }
}

/// The other KV-cache metadata rules, each by a file that breaks it (CPU and GPU path).
#[test]
fn each_kv_metadata_rule() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            kv_file(d, "a.safetensors", 2, (&[0, 1, 2, 3], 2), &[-1, 5], 0),
            "cache_seqlens[0] = -1",
        ),
        (
            kv_file(d, "b.safetensors", 2, (&[0, 1, 2, 3], 2), &[5, 31], 2),
            "cache_seqlens[1] = 31: with 2 new rows it must lie in [0, 30]",
        ),
        (
            kv_file(d, "c.safetensors", 2, (&[0, 1, 2, 3], 2), &[5, i32::MAX], 0),
            "must lie in [0, 32]",
        ),
        (
            kv_file(d, "d.safetensors", 2, (&[0, 1, 2, 3], 2), &[5], 0),
            "`cache_seqlens` has shape [1]; expected [2]",
        ),
        // A table with no slots: no capacity for the appended rows.
        (
            kv_file(d, "e.safetensors", 2, (&[], 0), &[0, 0], 1),
            "more than the cache's capacity 0",
        ),
        (
            kv_file(d, "f.safetensors", 2, (&[0, 1], 1), &[0, 0], 17),
            "append 17 rows, more than the cache's capacity 16",
        ),
        (
            kv_file(d, "g.safetensors", 2, (&[0, 1, 2, 3, 0, 1], 3), &[5, 50], 0),
            "must lie in [0, 48]",
        ),
        (
            write(
                d,
                "h.safetensors",
                &[
                    data("q", vec![2, 1, HQ, D]),
                    data("k_cache", vec![POOL, PAGE, HKV, D]),
                    data("v_cache", vec![POOL, PAGE, HKV, D]),
                    i32s("cache_seqlens", vec![2], &[1, 2]),
                    i32s("block_table", vec![4], &[0, 1, 2, 3]),
                ],
            ),
            "`block_table` has shape [4]; expected [2, max_pages]",
        ),
        (
            write(
                d,
                "i.safetensors",
                &[
                    data("q", vec![2, 1, HQ, D]),
                    data("k_cache", vec![POOL, PAGE, HKV, D]),
                    data("v_cache", vec![POOL, PAGE, HKV, D]),
                    i32s("cache_seqlens", vec![2], &[1, 2]),
                    ("block_table".into(), Dtype::F32, vec![2, 2], vec![0; 16]),
                ],
            ),
            "expected I32",
        ),
    ];
    for (f, want) in cases {
        for cpu in [true, false] {
            expect_error(&f, cpu, want);
        }
    }
}

/// Each `cu_seqlens` rule, by a file that breaks it (CPU and GPU path), extremes included.
#[test]
fn each_varlen_metadata_rule() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            varlen_file(d, "a.safetensors", &[1, 3], &[0, 3], (3, 3)),
            "`cu_seqlens_q`: must start at 0",
        ),
        (
            varlen_file(d, "b.safetensors", &[0, 3], &[0, 4, 3], (3, 3)),
            "`cu_seqlens_k`: has 3 entries",
        ),
        (
            varlen_file(d, "c.safetensors", &[0, 4, 3], &[0, 1, 3], (3, 3)),
            "non-decreasing",
        ),
        (
            varlen_file(d, "d.safetensors", &[0, 2], &[0, 3], (3, 3)),
            "last entry is 2",
        ),
        (
            varlen_file(d, "e.safetensors", &[0, i32::MAX], &[0, 3], (3, 3)),
            "last entry is 2147483647",
        ),
        (
            varlen_file(d, "f.safetensors", &[i32::MIN, i32::MAX], &[0, 3], (3, 3)),
            "must start at 0, starts at -2147483648",
        ),
        (
            varlen_file(d, "g.safetensors", &[0, i32::MIN, 3], &[0, 0, 3], (3, 3)),
            "non-decreasing",
        ),
        (
            varlen_file(d, "h.safetensors", &[0], &[0], (3, 3)),
            "last entry is 0",
        ),
        (
            varlen_file(d, "j.safetensors", &[], &[], (0, 0)),
            "has 0 entries",
        ),
        (
            write(
                d,
                "i.safetensors",
                &[
                    data("q", vec![3, HQ, D]),
                    data("k", vec![3, HKV, D]),
                    data("v", vec![3, HKV, D]),
                    i32s("cu_seqlens_q", vec![1, 2], &[0, 3]),
                    i32s("cu_seqlens_k", vec![2], &[0, 3]),
                ],
            ),
            "must be 1-D",
        ),
    ];
    for (f, want) in cases {
        for cpu in [true, false] {
            expect_error(&f, cpu, want);
        }
    }
}

/// Metadata values: mostly near the valid range, now and then an extreme.
fn meta() -> impl Strategy<Value = i32> {
    prop_oneof![
        8 => -3i32..40,
        1 => Just(i32::MIN),
        1 => Just(i32::MAX),
    ]
}

/// The KV-cache rules, stated independently of the library: a `[batch, slots]` table, every
/// length in [0, capacity − new] of a capacity of at least a page, every slot holding one of a sequence's keys inside the pool.
fn kv_valid(batch: usize, table: &[i32], slots: usize, lens: &[i32], new: usize) -> bool {
    let cap = slots * PAGE;
    cap > 0
        && lens.len() == batch
        && new <= cap
        && lens.iter().all(|&l| l >= 0 && l as usize + new <= cap)
        && (0..batch).all(|b| {
            let used = (lens[b] as usize + new).div_ceil(PAGE);
            table[b * slots..b * slots + used]
                .iter()
                .all(|&p| (0..POOL as i32).contains(&p))
        })
}

/// The varlen rules: `batch + 1` entries each, starting at 0, non-decreasing, ending at the
/// packed tensor's token count.
fn varlen_valid(cu_q: &[i32], cu_k: &[i32], totals: (usize, usize)) -> bool {
    let ok = |cu: &[i32], total: usize| {
        cu.len() >= 2
            && cu[0] == 0
            && cu.windows(2).all(|w| w[0] <= w[1])
            && *cu.last().unwrap() as usize == total
    };
    cu_q.len() == cu_k.len() && ok(cu_q, totals.0) && ok(cu_k, totals.1)
}

/// Whether this machine has a usable GPU (asked once).
fn have_gpu() -> bool {
    static GPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GPU.get_or_init(|| flashcore::attention::Context::new(0).is_ok())
}

/// The GPU path (no `--cpu`) on the same file: bad metadata gets the CPU path's error, before any
/// device is touched (so on any machine); good metadata runs where there is a GPU (`strict`:
/// successfully; otherwise — an empty pack — a clear error will do).
fn same_on_the_gpu_path(
    f: &Path,
    valid: bool,
    strict: bool,
    cpu_stderr: &str,
) -> Result<(), TestCaseError> {
    if valid && !have_gpu() {
        return Ok(());
    }
    let (code, stderr) = attn(f, false, &["--causal"]);
    if valid {
        prop_assert!(code == 0 || !strict, "GPU path: {}", stderr);
    } else {
        prop_assert_eq!(stderr.as_str(), cpu_stderr, "the GPU path's error differs");
    }
    Ok(())
}

proptest! {
    // Each case is one or two runs of the binary: few cases, so that two CI cores finish in seconds.
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_kv_metadata_is_answered_or_refused(
        batch in 1usize..4,
        slots in 0usize..4,
        table in prop::collection::vec(prop_oneof![4 => 0i32..4, 1 => meta()], 12),
        lens in prop::collection::vec(prop_oneof![3 => 0i32..48, 1 => meta()], 5),
        // Mostly one length per sequence, now and then one too few or too many.
        lens_delta in prop_oneof![6 => Just(1usize), 1 => Just(0), 1 => Just(2)],
        new in 0usize..3,
        short_table in any::<bool>(),
    ) {
        let lens = &lens[..(batch + lens_delta).saturating_sub(1).max(1)];
        let dir = tempfile::tempdir().unwrap();
        // A table one entry short of [batch, slots] now and then (its shape is then [n]).
        let n = batch * slots;
        let f = if short_table && n > 0 {
            let mut e = vec![
                data("q", vec![batch, 1, HQ, D]),
                data("k_cache", vec![POOL, PAGE, HKV, D]),
                data("v_cache", vec![POOL, PAGE, HKV, D]),
                i32s("cache_seqlens", vec![lens.len()], lens),
                i32s("block_table", vec![n - 1], &table[..n - 1]),
            ];
            if new > 0 {
                e.push(data("k", vec![batch, new, HKV, D]));
                e.push(data("v", vec![batch, new, HKV, D]));
            }
            write(dir.path(), "kv.safetensors", &e)
        } else {
            kv_file(dir.path(), "kv.safetensors", batch, (&table[..n], slots), lens, new)
        };
        let valid = !(short_table && n > 0) && kv_valid(batch, &table[..n], slots, lens, new);
        let (code, stderr) = attn(&f, true, &["--causal"]);
        prop_assert_eq!(code == 0, valid, "table {:?} lens {:?} new {}: {}", &table[..n], lens, new, stderr);
        same_on_the_gpu_path(&f, valid, true, &stderr)?;
    }

    #[test]
    fn random_varlen_metadata_is_answered_or_refused(
        cu_q in prop::collection::vec(meta(), 0..5),
        cu_k in prop::collection::vec(meta(), 0..5),
        totals in (0usize..40, 0usize..40),
        from_lengths in any::<bool>(),
    ) {
        // Half of the cases are prefix sums of random lengths (mostly valid), the rest raw.
        let (cu_q, cu_k, totals) = if from_lengths {
            let sums = |x: &[i32]| {
                let mut cu = vec![0i32];
                for &l in x {
                    cu.push(cu.last().unwrap() + (l.rem_euclid(12)));
                }
                cu
            };
            let (q, k) = (sums(&cu_q), sums(&cu_q.iter().rev().copied().collect::<Vec<_>>()));
            let t = (*q.last().unwrap() as usize, *k.last().unwrap() as usize);
            (q, k, (t.0.max(totals.0 % 2), t.1))
        } else {
            (cu_q, cu_k, totals)
        };
        let dir = tempfile::tempdir().unwrap();
        let f = varlen_file(dir.path(), "v.safetensors", &cu_q, &cu_k, totals);
        let valid = varlen_valid(&cu_q, &cu_k, totals);
        let (code, stderr) = attn(&f, true, &["--causal"]);
        prop_assert_eq!(code == 0, valid, "cu_q {:?} cu_k {:?} totals {:?}: {}", cu_q, cu_k, totals, stderr);
        same_on_the_gpu_path(&f, valid, totals.0 > 0 && totals.1 > 0, &stderr)?;
    }
}
