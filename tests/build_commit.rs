//! Records name the build that made them: the binary's own commit (recorded at build time) wins
//! over `$FLASHCORE_GIT_COMMIT`, which only fills in for a build that does not know its commit;
//! the current directory's repository is never asked.

use flashcore::bench::env::{build_commit, resolve_commit};
use std::process::Command;

const A: &str = "0123456789abcdef0123456789abcdef01234567";
const B: &str = "fedcba9876543210fedcba9876543210fedcba98";

#[test]
fn the_build_commit_wins_and_a_disagreeing_environment_is_warned_about() {
    assert_eq!(resolve_commit(Some(A), None), (Some(A.into()), None));
    assert_eq!(resolve_commit(Some(A), Some(A)), (Some(A.into()), None));
    // A short form of the same commit agrees.
    assert_eq!(
        resolve_commit(Some(A), Some(&A[..9])),
        (Some(A.into()), None)
    );
    let (c, w) = resolve_commit(Some(A), Some(B));
    assert_eq!(c.as_deref(), Some(A));
    let w = w.expect("a warning");
    assert!(w.contains(A) && w.contains(B), "{w}");
}

#[test]
fn without_a_build_commit_the_environment_fills_in_if_it_is_a_commit() {
    assert_eq!(resolve_commit(None, Some(B)), (Some(B.into()), None));
    assert_eq!(resolve_commit(None, Some(" HEAD ")), (None, None));
    assert_eq!(resolve_commit(None, None), (None, None));
}

#[test]
fn the_build_commit_is_this_checkouts_head() {
    // Only under `cargo test` (which sets CARGO_MANIFEST_DIR at run time and rebuilds first): a
    // test binary carried to another tree is exactly the case where the two may differ.
    if std::env::var_os("CARGO_MANIFEST_DIR").is_none() {
        eprintln!("SKIPPED build commit check: not run by cargo in the checkout it was built from");
        return;
    }
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match head {
        Some(head) => assert_eq!(build_commit(), Some(head.as_str())),
        None => eprintln!("SKIPPED build commit check: not a git checkout (or no git)"),
    }
}
