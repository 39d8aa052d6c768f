//! `flashcore bench --suite varlen` without a GPU: the seeded mixes (pinned, and equal to
//! bench/varlen.py's row for row), the cases, FLOP counts and the dense comparison shape.

use flashcore::bench::varlen::{cases, dense_shape, flops, mix, MIXES, TOKENS};
use std::process::Command;

#[test]
fn mixes_fill_the_tokens_and_are_pinned() {
    for total in TOKENS {
        for m in MIXES {
            let l = mix(m, total, 0x5EED).unwrap();
            assert_eq!(l.iter().sum::<usize>(), total, "{m}/{total}");
            assert!(l.iter().all(|&n| (1..=total).contains(&n)), "{m}/{total}");
            match m {
                "uniform" => assert!(l.iter().all(|&n| n <= 4096)),
                "skewed" => {
                    assert_eq!(&l[..2], &[total / 4, total / 4]);
                    assert!(l[2..].iter().all(|&n| n <= 256));
                }
                _ => assert!(l.iter().all(|&n| n == 4096)),
            }
        }
    }
    // The first lengths as bench/varlen.py draws them (python3 bench/varlen.py --print-mixes).
    assert_eq!(
        mix("uniform", 16384, 0x5EED).unwrap(),
        [1493, 208, 2682, 1407, 3950, 3037, 3607]
    );
    assert_eq!(
        &mix("skewed", 16384, 0x5EED).unwrap()[..6],
        &[4096, 4096, 253, 250, 217, 215]
    );
    assert_eq!(
        &mix("uniform", 65536, 0x5EED).unwrap()[..6],
        &[2550, 1498, 3531, 14, 2335, 1729]
    );
    assert_eq!(mix("another", 16384, 1), None);
    assert_ne!(mix("uniform", 16384, 1), mix("uniform", 16384, 2));
}

#[test]
fn cases_and_flops() {
    let c = cases(0x5EED);
    assert_eq!(c.len(), 2 * 3 * 2 * 2);
    assert!(c.iter().all(|c| c.heads * c.head_dim == 2048));
    let first = &c[0];
    assert_eq!(
        (first.mix, first.tokens, first.head_dim, first.causal),
        ("uniform", 16384, 64, false)
    );
    let p = first.params();
    assert_eq!((p.batch, p.seqlen_q, p.heads_q), (7, 3950, 32));
    // Useful FLOPs: the real pairs only; causal halves them.
    assert_eq!(
        flops(&[3, 5], 2, 64, false),
        4.0 * 2.0 * 64.0 * (9.0 + 25.0)
    );
    assert_eq!(flops(&[3, 5], 2, 64, true), 2.0 * 2.0 * 64.0 * (9.0 + 25.0));
    // The dense shape: 7 sequences, mean 16384 / 7 = 2340.57 → 2341.
    assert_eq!(dense_shape(&first.lens, 16384), (7, 2341));
    let d = first.dense();
    assert_eq!(
        (d.batch, d.seqlen_q, d.heads_q, d.head_dim),
        (7, 2341, 32, 64)
    );
    assert_eq!(dense_shape(&[4096; 4], 16384), (4, 4096));
    assert_eq!(dense_shape(&[1, 2], 3), (2, 2)); // 1.5 rounds up; 3 / 2 rounds up
}

/// bench/varlen.py --print-mixes lists the same sequences and dense shapes (python3 only, no
/// torch needed).
#[test]
fn python_script_draws_the_same_mixes() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/varlen.py");
    let out = match Command::new("python3")
        .args([script, "--print-mixes"])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED python cross-check: cannot run python3 ({e})");
            return;
        }
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for total in TOKENS {
        for m in MIXES {
            let e = &py[format!("{m}/{total}")];
            let lens: Vec<usize> = serde_json::from_value(e["lens"].clone()).unwrap();
            let rust = mix(m, total, 0x5EED).unwrap();
            assert_eq!(lens, rust, "{m}/{total}");
            let dense: (usize, usize) = serde_json::from_value(e["dense"].clone()).unwrap();
            assert_eq!(dense, dense_shape(&rust, total), "{m}/{total}");
        }
    }
}

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flashcore"))
        .arg("bench")
        .args(args)
        .output()
        .expect("run flashcore")
}

/// `--suite varlen`'s usage errors exit 2 with the reason, before any device work.
#[test]
fn varlen_suite_usage_errors() {
    for (args, why) in [
        (&["--backward"][..], "forward only"),
        (&["--phases", "3"][..], "forward only"),
        (&["--compare", "x.json"][..], "forward only"),
        (&["--plot", "x.png"][..], "forward only"),
        (&["--layout", "bhsd"][..], "packed (bshd)"),
        (
            &["--headdim", "96"][..],
            "no shapes of that dtype and head dim",
        ),
        (
            &["--dtype", "f16"][..],
            "no shapes of that dtype and head dim",
        ),
        (
            &["--seqlen", "512"][..],
            "either --suite or an ad-hoc shape",
        ),
    ] {
        let mut all = vec!["--suite", "varlen"];
        all.extend_from_slice(args);
        let o = bench(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{all:?}: {err}");
        assert!(err.contains(why), "{all:?}: {err}");
    }
}

/// Without a GPU the suite is a runtime failure (exit 1) that says why, nothing measured.
#[test]
fn varlen_suite_without_gpu_fails() {
    if flashcore::attention::Context::new(0).is_ok() {
        eprintln!("SKIPPED varlen_suite_without_gpu_fails: a GPU is present");
        return;
    }
    let o = bench(&["--suite", "varlen", "--headdim", "64"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("CUDA"));
}
