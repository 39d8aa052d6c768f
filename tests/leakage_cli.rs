//! `flashcore leakage` as a process: usage errors exit 2 before any device is touched, and with
//! no GPU it exits 2 with a clear message.

use std::process::Command;

fn flashcore(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flashcore"))
        .arg("leakage")
        .args(args)
        .output()
        .expect("run flashcore")
}

fn usage_error(args: &[&str], says: &str) {
    let o = flashcore(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(says), "{args:?}: expected `{says}` in: {err}");
}

#[test]
fn usage_errors_exit_2() {
    usage_error(&["--class", "nope"], "unknown class `nope`");
    usage_error(&["--class", "len-0"], "--secret-len");
    usage_error(&["--secret-len", "--class", "zeros"], "drop --secret-len");
    usage_error(&["--measurements", "10"], "--measurements must be at least");
    usage_error(&["--budget-s", "0"], "--budget-s");
    usage_error(&["--budget-s=-3"], "--budget-s");
    usage_error(&["--budget-s", "nan"], "--budget-s");
    usage_error(&["--pool", "4"], "--pool must be at least 16");
    usage_error(&["--headdim", "80"], "head_dim");
    usage_error(&["--control", "early-exit", "--secret-len"], "early-exit");
    usage_error(&["--control", "sometimes"], "invalid value");
    usage_error(&["--dtype", "f32"], "f32");
    usage_error(&["--layout", "sbhd"], "sbhd");
    usage_error(&["--no-such-flag"], "no-such-flag");
    usage_error(&["--queue-us=-1"], "--queue-us");
    usage_error(&["--queue-us", "nan"], "--queue-us");
    usage_error(&["--queue-us", "5000"], "--queue-us must be at most 1000");
    usage_error(
        &["--control", "floor", "--secret-len", "--class", "zeros"],
        "drop --secret-len",
    );
}

/// Decode mode: each refusal exits 2 with what to do, before any device is touched.
#[test]
fn decode_usage_errors_exit_2() {
    let d = ["--decode", "--secret-len"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        d.iter().chain(extra.iter()).copied().collect()
    };
    usage_error(&["--decode"], "add --secret-len");
    for flag in [
        &["--seqlen-q", "4"][..],
        &["--kv-heads", "2"][..],
        &["--public-counts"][..],
        &["--page-size", "64"][..],
        &["--page-order", "identity"][..],
    ] {
        usage_error(flag, "belongs to decode mode: add --decode --secret-len");
    }
    usage_error(&with(&["--page-order", "identity"]), "add --page-size");
    usage_error(&with(&["--page-order", "sideways"]), "invalid value");
    for control in ["early-exit", "skip-past-length", "floor"] {
        usage_error(&with(&["--control", control]), "--public-counts");
    }
    usage_error(&with(&["--class", "zeros"]), "in decode mode");
    usage_error(&with(&["--seqlen-q", "17"]), "at most 16");
    usage_error(&with(&["--kv-heads", "3"]), "heads_kv");
    usage_error(&with(&["--page-size", "0"]), "at least 1 row");
    usage_error(&with(&["--page-size", "24"]), "512 is not a multiple of 24");
    usage_error(
        &with(&["--seqlen", "500", "--page-size", "64"]),
        "not a multiple of 64",
    );
    usage_error(&with(&["--page-size", "64", "--layout", "bhsd"]), "bshd");
    usage_error(&with(&["--measurements", "10"]), "--measurements");
}

#[test]
fn no_gpu_exits_2_with_a_message() {
    if std::path::Path::new("/dev/nvidia0").exists() {
        eprintln!("SKIPPED no_gpu_exits_2_with_a_message: this machine has a GPU");
        return;
    }
    for args in [
        &[][..],
        &["--class", "zeros", "--measurements", "1000"][..],
        &["--secret-len", "--control", "skip-past-length"][..],
        &["--secret-len"][..],
        &["--control", "floor", "--queue-us", "0"][..],
        &["--control", "early-exit", "--no-floor"][..],
        &["--decode", "--secret-len"][..],
        &[
            "--decode",
            "--secret-len",
            "--public-counts",
            "--page-size",
            "64",
            "--kv-heads",
            "2",
        ][..],
    ] {
        let o = flashcore(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("flashcore: error:"), "{err}");
        assert!(err.contains("needs a usable GPU"), "{err}");
        assert!(o.stdout.is_empty(), "no table without measurements");
    }
}

#[test]
fn help_lists_the_options() {
    let o = flashcore(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--batch",
        "--heads",
        "--seqlen",
        "--headdim",
        "--dtype",
        "--causal",
        "--layout",
        "--measurements",
        "--budget-s",
        "--class",
        "--secret-len",
        "--control",
        "--json",
        "--no-cycles",
        "--no-floor",
        "--queue-us",
        "floor",
        "--decode",
        "--seqlen-q",
        "--kv-heads",
        "--public-counts",
        "--page-size",
        "--page-order",
    ] {
        assert!(out.contains(flag), "{flag} missing from --help");
    }
    assert!(
        out.contains(&format!(
            "version {}",
            flashcore::leakage::report::SCHEMA_VERSION
        )),
        "--help names the JSON schema version"
    );
}
