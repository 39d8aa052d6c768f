//! Property tests (proptest, bounded case counts so CI stays fast): parameter validation agrees
//! with an independent statement of the rules and never panics; the safetensors reader, the
//! audit of mutated cubins and of mutated SASS text never panic — they answer or return a typed
//! error.

use flashcore::attention::validate::check_params;
use flashcore::attention::{AttentionParams, DType, Layout};
use flashcore::tensor_io::{read_attn_input, write_file, Tensor, TensorData};
use proptest::prelude::*;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..5,
        1usize..5000,
        Just((1usize << 31) - 1),
        Just(1usize << 31),
        (1usize << 20)..(1usize << 32),
    ]
}

/// The rules of docs/design.md §1, written out independently of src/attention/validate.rs.
fn valid(p: &AttentionParams) -> bool {
    let dims = [
        p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim,
    ];
    let in_range = dims.iter().all(|d| (1..(1 << 31)).contains(d));
    let bytes =
        |s: usize, h: usize| p.batch as u128 * s as u128 * h as u128 * p.head_dim as u128 * 2;
    in_range
        && (p.head_dim == 64 || p.head_dim == 128)
        && p.heads_q % p.heads_kv == 0
        && p.scale.is_none_or(|s| s.is_finite() && s > 0.0)
        && bytes(p.seqlen_q, p.heads_q).max(bytes(p.seqlen_k, p.heads_kv)) < (1 << 40)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    #[test]
    fn validation_matches_the_rules(
        b in dim(), sq in dim(), sk in dim(), hq in dim(), hkv in dim(),
        d in prop_oneof![Just(64usize), Just(128), 0usize..300],
        scale in prop_oneof![Just(None), any::<f32>().prop_map(Some)],
        bf16 in any::<bool>(), causal in any::<bool>(),
    ) {
        let mut p = AttentionParams::new(b, hq, sq, d)
            .seqlen_k(sk)
            .dtype(if bf16 { DType::Bf16 } else { DType::F16 })
            .causal(causal);
        p.heads_kv = hkv;
        p.scale = scale;
        prop_assert_eq!(check_params(&p).is_ok(), valid(&p), "{:?}", p);
    }
}

/// A small valid input file's bytes (bshd, f16).
fn valid_file() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.safetensors");
        let t = |n: usize| Tensor {
            shape: vec![1, 3, 2, 64],
            data: TensorData::F16(
                (0..n)
                    .map(|i| half::f16::from_f32(i as f32 / 97.0))
                    .collect(),
            ),
        };
        let (q, k, v) = (t(384), t(384), t(384));
        write_file(&path, &[("q", &q), ("k", &k), ("v", &v)], None).unwrap();
        std::fs::read(&path).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]
    #[test]
    fn the_input_reader_never_panics_on_mutated_files(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in prop_oneof![Just(None), any::<prop::sample::Index>().prop_map(Some)],
        bhsd in any::<bool>(),
    ) {
        let mut bytes = valid_file().to_vec();
        for (i, x) in &flips {
            let at = i.index(bytes.len());
            bytes[at] ^= x;
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len() + 1));
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        // Ok or a typed error; a panic fails the test.
        let _ = read_attn_input(&path, if bhsd { Layout::Bhsd } else { Layout::Bshd });
    }
}

/// The limit on each nvdisasm/cuobjdump run in these tests, far below the 120 s default: the
/// sample kernel disassembles in milliseconds, and a mutated cubin can make nvdisasm loop
/// forever (tests/audit_corpus/nvdisasm_hang.cubin did), which must cost seconds, not CI's
/// whole budget.
const TOOL_LIMIT: Duration = Duration::from_secs(10);

/// A small kernel's cubin and SASS listing, or None (printed) without NVRTC/nvdisasm. Also sets
/// [`TOOL_LIMIT`] for this process (every test that runs a tool gets here first).
fn sample() -> Option<&'static (Vec<u8>, String)> {
    static S: OnceLock<Option<(Vec<u8>, String)>> = OnceLock::new();
    flashcore::jit::toolkit::set_tool_timeout(Some(TOOL_LIMIT));
    S.get_or_init(|| {
        let src = r#"extern "C" __global__ void k(const float* x, float* y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            float v = i < n ? x[i] : 0.f;
            y[i < n ? i : 0] = v > 1.f ? v * v : v + 1.f;
        }"#;
        let cubin =
            match flashcore::jit::compile_cached("k", src, &[], &flashcore::jit::base_options()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("SKIPPED audit fuzzing: {e}");
                    return None;
                }
            };
        match flashcore::audit::disassemble(&cubin) {
            Ok(listing) => Some((cubin, listing)),
            Err(e) => {
                eprintln!("SKIPPED audit fuzzing: {e}");
                None
            }
        }
    })
    .as_ref()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn the_audit_never_panics_on_mutated_cubins(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in prop_oneof![Just(None), any::<prop::sample::Index>().prop_map(Some)],
    ) {
        let Some((cubin, _)) = sample() else { return Ok(()) };
        let mut bytes = cubin.clone();
        for (i, x) in &flips {
            let at = i.index(bytes.len());
            bytes[at] ^= x;
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len() + 1));
        }
        let _ = flashcore::audit::audit_cubin(&bytes, &[0]);
    }
}

/// The mutated cubin that made nvdisasm hang for 23 minutes: the audit now ends within the
/// limit, with a verdict or a typed error (a timeout while nvdisasm still loops on it).
#[test]
fn the_cubin_that_hung_nvdisasm_is_answered_within_the_limit() {
    if sample().is_none() {
        return;
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/audit_corpus/nvdisasm_hang.cubin"
    );
    let bytes = std::fs::read(path).unwrap();
    let t = Instant::now();
    let r = flashcore::audit::audit_cubin(&bytes, &[0]);
    let took = t.elapsed();
    eprintln!(
        "nvdisasm_hang.cubin after {took:?}: {:?}",
        r.as_ref().map(|a| a.len())
    );
    assert!(took < TOOL_LIMIT + Duration::from_secs(30), "took {took:?}");
    if let Err(flashcore::Error::ToolTimeout { tool, .. }) = &r {
        assert_eq!(*tool, "nvdisasm");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn the_audit_never_panics_on_mutated_sass(
        edits in prop::collection::vec(
            (any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0u8..4, "[ -~]{0,12}"),
            1..6,
        ),
    ) {
        let Some((_, listing)) = sample() else { return Ok(()) };
        let mut lines: Vec<String> = listing.lines().map(str::to_string).collect();
        for (li, ci, op, text) in &edits {
            let l = li.index(lines.len());
            let line = &mut lines[l];
            let mut chars: Vec<char> = line.chars().collect();
            let c = ci.index(chars.len() + 1);
            match op {
                0 => chars.truncate(c),                                  // cut the line
                1 => { chars.splice(c..c, text.chars()); }              // insert text
                2 => { lines.remove(l); continue; }                     // drop the line
                _ => { let dup = line.clone(); lines.insert(l, dup); continue; } // repeat it
            }
            *line = chars.into_iter().collect();
        }
        let _ = flashcore::audit::audit_listing(&lines.join("\n"));
    }
}

#[test]
fn a_size_that_wraps_around_64_bits_is_still_too_large() {
    // 2^30 · 2^30 · 16 · 64 elements = 2^70: a usize product wraps to 0 and looked valid.
    let p = AttentionParams::new(1 << 30, 16, 1 << 30, 64);
    assert!(!valid(&p));
    match check_params(&p) {
        Err(flashcore::Error::InvalidArgument { arg, rule }) => {
            assert_eq!(arg, "batch");
            assert!(rule.contains("2^40"), "{rule}");
        }
        other => panic!("expected the size error, got {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    /// Through the CLI: a mutated cubin or SASS file is answered (0 clean, 1 findings) or refused
    /// with exit 2 and one `flashcore: error:` line — never a panic.
    #[test]
    fn the_audit_cli_answers_or_refuses_mutated_files(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        sass in any::<bool>(),
    ) {
        let Some((cubin, listing)) = sample() else { return Ok(()) };
        let mut bytes = if sass { listing.as_bytes().to_vec() } else { cubin.clone() };
        for (i, x) in &flips {
            let at = i.index(bytes.len());
            bytes[at] ^= x;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(if sass { "k.sass" } else { "k.cubin" });
        std::fs::write(&path, &bytes).unwrap();
        let flag = if sass { "--sass" } else { "--cubin" };
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_flashcore"))
            .args(["audit", flag, path.to_str().unwrap()])
            .env(flashcore::jit::toolkit::TOOL_TIMEOUT_ENV, TOOL_LIMIT.as_secs().to_string())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        prop_assert!(!err.contains("panicked"), "{}", err);
        let code = o.status.code();
        prop_assert!(matches!(code, Some(0..=2)), "exit {:?}: {}", code, err);
        if code == Some(2) {
            prop_assert!(err.starts_with("flashcore: error:"), "{}", err);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    /// The readers of users' text — `__global__` signatures, mangled kernel names, nvdisasm's
    /// line comments, `--secret-param` values — never panic on any input.
    #[test]
    fn the_user_text_readers_never_panic(
        text in "[ -~\n\u{e9}\u{4e2d}]{0,200}",
        cut in any::<prop::sample::Index>(),
    ) {
        use flashcore::audit::{signature, srcloc, ParamSpec};
        let sample = "extern \"C\" __global__ void __launch_bounds__(128) k(const float* __restrict__ q, int n = 3, float (*f)(int), T x[4]) {}\n";
        let spliced = {
            let chars: Vec<char> = sample.chars().collect();
            let at = cut.index(chars.len() + 1);
            let mut s: String = chars[..at].iter().collect();
            s.push_str(&text);
            s.extend(&chars[at..]);
            s
        };
        for s in [&text, &spliced] {
            for sig in signature::parse_signatures(s) {
                let _ = signature::param_ordinal(std::slice::from_ref(&sig), &sig.name, sig.params.len(), "q");
            }
            let _ = signature::base_name(s);
            let _ = signature::base_name(&format!("_Z{s}"));
            let _ = signature::base_name(&format!("_ZN{s}"));
            let _ = srcloc::parse(&format!("//## File {s}"));
            let _ = srcloc::parse(&format!("//## File \"a\", line 1 inlined at {s}"));
            let _ = s.parse::<ParamSpec>();
        }
    }
}
