//! The bits of a few calls pinned to stored hashes, so that a change of any of them is seen on
//! whichever GPU runs this (flashcore's outputs are bitwise identical across Hopper GPU models):
//! a prefill tile, a causal GQA prefill, decode with key splits over a contiguous and a paged
//! cache, a varlen pack and a backward pass. Inputs come from a fixed host generator; each call's
//! outputs (O, LSE, and dQ, dK, dV for the backward) are hashed with SHA-256 and compared to
//! `tests/bit_pins.txt`. Skipped visibly without a GPU (FLASHCORE_REQUIRE_GPU=1: a failure).
//!
//! To record the pins (on purpose, after a change that is meant to move bits):
//!   WRITE_BIT_PINS=1 cargo test --release --test gpu_bit_pins
//! writes the file (FLASHCORE_BIT_PINS names another path; with $OUT set, a copy goes there too).
//! Run without FLASHCORE_* kernel knobs: they choose other kernels.

mod common;

use flashcore::attention::{AttentionParams, Context, DType, Element, KvCache, Pages};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A fixed generator (SplitMix64), independent of any crate's versions.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `n` values uniform in [-2, 2) on a 2^-20 grid, rounded to the element type.
    fn values<T: Element>(&mut self, n: usize) -> Vec<T> {
        (0..n)
            .map(|_| T::from_f64((self.next() >> 44) as f64 / (1u64 << 18) as f64 - 2.0))
            .collect()
    }
}

/// An element's bits, for hashing.
trait Bits: Element {
    fn bytes(x: &[Self]) -> Vec<u8>;
}

impl Bits for half::f16 {
    fn bytes(x: &[Self]) -> Vec<u8> {
        x.iter().flat_map(|e| e.to_bits().to_le_bytes()).collect()
    }
}

impl Bits for half::bf16 {
    fn bytes(x: &[Self]) -> Vec<u8> {
        x.iter().flat_map(|e| e.to_bits().to_le_bytes()).collect()
    }
}

fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|e| e.to_bits().to_le_bytes()).collect()
}

/// SHA-256 over the parts in order, hex.
fn hash(parts: &[Vec<u8>]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    hex::encode(h.finalize())
}

fn poisoned<T: Element>(ctx: &Context, n: usize) -> cudarc::driver::CudaSlice<T> {
    ctx.upload(&vec![common::poison::<T>(); n]).unwrap()
}

/// A dense call: O and LSE.
fn dense<T: Bits>(ctx: &Context, p: &AttentionParams, seed: u64) -> String {
    let mut g = Gen(seed);
    let (q, k, v) = (
        g.values::<T>(p.q_len()),
        g.values::<T>(p.kv_len()),
        g.values::<T>(p.kv_len()),
    );
    let (dq, dk, dv) = common::upload_qkv(ctx, &q, &k, &v);
    let mut out = poisoned::<T>(ctx, p.q_len());
    let mut lse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
    ctx.attention(p, &dq, &dk, &dv, &mut out, Some(&mut lse))
        .unwrap();
    hash(&[
        T::bytes(&ctx.download(&out).unwrap()),
        f32_bytes(&ctx.download(&lse).unwrap()),
    ])
}

/// A KV-cache decode call over `counts` keys: contiguous, or (with `pages`) a shuffled table
/// over a pool with spare pages.
fn decode<T: Bits>(
    ctx: &Context,
    p: &AttentionParams,
    counts: &[i32],
    pages: Option<Pages>,
    seed: u64,
) -> String {
    let mut g = Gen(seed);
    let cache_len = match pages {
        Some(pg) => pg.pool_len(p),
        None => p.kv_len(),
    };
    let q = g.values::<T>(p.q_len());
    let (k, v) = (g.values::<T>(cache_len), g.values::<T>(cache_len));
    let (dq, dk, dv) = common::upload_qkv(ctx, &q, &k, &v);
    let dl = ctx.upload(counts).unwrap();
    let table: Vec<i32> = match pages {
        Some(pg) => {
            let slots = p.batch * p.seqlen_k / pg.page_size;
            (0..slots)
                .map(|i| ((i * 7 + 3) % pg.num_pages) as i32)
                .collect()
        }
        None => vec![],
    };
    let dt = pages.map(|_| ctx.upload(&table).unwrap());
    let cache = match (&dt, pages) {
        (Some(dt), Some(pg)) => KvCache::paged(&dk, &dv, &dl, dt, pg),
        _ => KvCache::contiguous(&dk, &dv, &dl),
    };
    let mut out = poisoned::<T>(ctx, p.q_len());
    let mut lse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
    ctx.attention_kv_cache(p, &dq, &cache, &mut out, Some(&mut lse))
        .unwrap();
    hash(&[
        T::bytes(&ctx.download(&out).unwrap()),
        f32_bytes(&ctx.download(&lse).unwrap()),
    ])
}

/// A varlen pack of sequences with the given query and key counts: O and LSE.
fn varlen<T: Bits>(ctx: &Context, p: &AttentionParams, cu: [&[i32]; 2], seed: u64) -> String {
    let mut g = Gen(seed);
    let (tq, tk) = (
        *cu[0].last().unwrap() as usize,
        *cu[1].last().unwrap() as usize,
    );
    let q = g.values::<T>(tq * p.heads_q * p.head_dim);
    let k = g.values::<T>(tk * p.heads_kv * p.head_dim);
    let v = g.values::<T>(tk * p.heads_kv * p.head_dim);
    let (dq, dk, dv) = common::upload_qkv(ctx, &q, &k, &v);
    let mut out = poisoned::<T>(ctx, q.len());
    let mut lse = ctx.upload(&vec![f32::NAN; tq * p.heads_q]).unwrap();
    ctx.attention_varlen_host(p, &dq, &dk, &dv, cu[0], cu[1], &mut out, Some(&mut lse))
        .unwrap();
    hash(&[
        T::bytes(&ctx.download(&out).unwrap()),
        f32_bytes(&ctx.download(&lse).unwrap()),
    ])
}

/// The forward and the backward: O, LSE, dQ, dK, dV.
fn backward<T: Bits>(ctx: &Context, p: &AttentionParams, seed: u64) -> String {
    let mut g = Gen(seed);
    let (q, k, v) = (
        g.values::<T>(p.q_len()),
        g.values::<T>(p.kv_len()),
        g.values::<T>(p.kv_len()),
    );
    let d_o = g.values::<T>(p.q_len());
    let (dq_in, dk_in, dv_in) = common::upload_qkv(ctx, &q, &k, &v);
    let ddo = ctx.upload(&d_o).unwrap();
    let mut out = poisoned::<T>(ctx, p.q_len());
    let mut lse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
    ctx.attention(p, &dq_in, &dk_in, &dv_in, &mut out, Some(&mut lse))
        .unwrap();
    let (mut gq, mut gk, mut gv) = (
        poisoned::<T>(ctx, p.q_len()),
        poisoned::<T>(ctx, p.kv_len()),
        poisoned::<T>(ctx, p.kv_len()),
    );
    ctx.attention_backward(
        p,
        &dq_in,
        &dk_in,
        &dv_in,
        &out,
        Some(&lse),
        &ddo,
        &mut gq,
        &mut gk,
        &mut gv,
    )
    .unwrap();
    hash(&[
        T::bytes(&ctx.download(&out).unwrap()),
        f32_bytes(&ctx.download(&lse).unwrap()),
        T::bytes(&ctx.download(&gq).unwrap()),
        T::bytes(&ctx.download(&gk).unwrap()),
        T::bytes(&ctx.download(&gv).unwrap()),
    ])
}

fn gqa(p: AttentionParams, heads_kv: usize) -> AttentionParams {
    AttentionParams { heads_kv, ..p }
}

/// Each pinned call's name and hash, run now.
fn run_all(ctx: &Context) -> BTreeMap<&'static str, String> {
    use half::{bf16, f16};
    let mut h = BTreeMap::new();
    let tile = AttentionParams::new(2, 4, 256, 128).dtype(DType::Bf16);
    h.insert("prefill_tile_bf16_d128", dense::<bf16>(ctx, &tile, 1));
    let causal = gqa(
        AttentionParams::new(1, 4, 384, 64)
            .seqlen_k(384)
            .causal(true)
            .dtype(DType::F16),
        2,
    );
    h.insert("prefill_causal_gqa_f16_d64", dense::<f16>(ctx, &causal, 2));
    // A capacity of 8192 keys: split into work units (a size fixed by the capacity).
    let split = gqa(
        AttentionParams::new(2, 8, 1, 128)
            .seqlen_k(8192)
            .causal(true)
            .dtype(DType::Bf16),
        2,
    );
    h.insert(
        "decode_split_bf16_d128",
        decode::<bf16>(ctx, &split, &[8000, 3001], None, 3),
    );
    let paged = gqa(
        AttentionParams::new(2, 8, 1, 128)
            .seqlen_k(1024)
            .causal(true)
            .dtype(DType::Bf16),
        2,
    );
    let pages = Pages {
        page_size: 64,
        num_pages: 40,
    };
    h.insert(
        "decode_paged_bf16_d128",
        decode::<bf16>(ctx, &paged, &[1000, 555], Some(pages), 4),
    );
    let (cu_q, cu_k) = ([0, 100, 357, 400], [0, 130, 357, 700]);
    let pack = gqa(
        AttentionParams::new(3, 4, 257, 128)
            .seqlen_k(343)
            .causal(true)
            .dtype(DType::Bf16),
        2,
    );
    h.insert(
        "varlen_causal_bf16_d128",
        varlen::<bf16>(ctx, &pack, [&cu_q, &cu_k], 5),
    );
    let bwd = gqa(
        AttentionParams::new(1, 4, 256, 128)
            .causal(true)
            .dtype(DType::Bf16),
        2,
    );
    h.insert(
        "backward_causal_gqa_bf16_d128",
        backward::<bf16>(ctx, &bwd, 6),
    );
    h
}

fn pins_path() -> PathBuf {
    if let Ok(p) = std::env::var("FLASHCORE_BIT_PINS") {
        return p.into();
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests");
    // A test binary carried to another machine runs from the repository root there.
    let dir = if manifest.is_dir() {
        manifest
    } else {
        PathBuf::from("tests")
    };
    dir.join("bit_pins.txt")
}

fn read_pins(path: &PathBuf) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.to_string()))
        })
        .collect()
}

#[test]
fn outputs_match_their_pinned_hashes() {
    let Some(ctx) = common::gpu("outputs_match_their_pinned_hashes") else {
        return;
    };
    let now = run_all(&ctx);
    let path = pins_path();
    if std::env::var("WRITE_BIT_PINS").as_deref() == Ok("1") {
        let mut text = format!(
            "# SHA-256 of each call's output bits (tests/gpu_bit_pins.rs), recorded on {}.\n# Rewrite with WRITE_BIT_PINS=1 only for a change meant to move bits.\n",
            ctx.device_name()
        );
        for (name, h) in &now {
            text.push_str(&format!("{name} {h}\n"));
        }
        std::fs::write(&path, &text).unwrap();
        if let Ok(out) = std::env::var("OUT") {
            std::fs::write(PathBuf::from(out).join("bit_pins.txt"), &text).unwrap();
        }
        eprintln!("wrote {}:\n{text}", path.display());
        return;
    }
    let pins = read_pins(&path);
    let mut failures = Vec::new();
    for (name, h) in &now {
        match pins.get(*name) {
            None => failures.push(format!(
                "{name}: no pin in {} (record with WRITE_BIT_PINS=1); now {h}",
                path.display()
            )),
            Some(want) if want != h => {
                failures.push(format!("{name}: bits changed: pinned {want}, now {h}"))
            }
            Some(_) => {}
        }
    }
    for name in pins.keys() {
        if !now.contains_key(name.as_str()) {
            failures.push(format!("{name}: pinned but no longer run"));
        }
    }
    assert!(
        failures.is_empty(),
        "on {}:\n{}",
        ctx.device_name(),
        failures.join("\n")
    );
}

/// The pin file's reader: comments and blank lines skipped, one `name hash` per line.
#[test]
fn the_pin_file_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pins.txt");
    std::fs::write(&path, "# header\n\na 01ab\nb  ff00 \n").unwrap();
    let pins = read_pins(&path);
    assert_eq!(pins.len(), 2);
    assert_eq!(pins["a"], "01ab");
    assert_eq!(pins["b"], "ff00");
    assert_eq!(hash(&[vec![], b"abc".to_vec()]).len(), 64);
    assert_eq!(
        hash(&[b"abc".to_vec()]),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    // The generator is fixed: its first values never change.
    let mut g = Gen(1);
    assert_eq!(g.next(), 0x910a_2dec_8902_5cc1);
}
