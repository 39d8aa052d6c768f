//! Safe output writing (src/output.rs): atomic replacement, no torn or leftover files, and the
//! same-file check that keeps an output from overwriting an input.

use flashcore::output::{check_not_an_input, same_file, write_atomic, write_atomic_with};
use flashcore::Error;
use std::path::Path;

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn write_atomic_replaces_the_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.json");
    std::fs::write(&path, b"old contents that are longer than the new ones").unwrap();
    write_atomic(&path, b"new").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
    assert_eq!(entries(dir.path()), ["a.json"]);
}

#[test]
fn a_failed_write_leaves_the_destination_and_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plot.png");
    std::fs::write(&path, b"the previous plot").unwrap();
    let r = write_atomic_with(&path, |tmp| {
        // A writer that gets halfway and fails (e.g. a full disk): the temporary keeps the
        // destination's extension so encoders that pick the format by name still work.
        assert_eq!(tmp.extension().unwrap(), "png");
        std::fs::write(tmp, b"half").unwrap();
        Err(Error::Other("disk full".into()))
    });
    assert!(matches!(r, Err(Error::Other(m)) if m == "disk full"));
    assert_eq!(std::fs::read(&path).unwrap(), b"the previous plot");
    assert_eq!(entries(dir.path()), ["plot.png"]);
}

#[test]
fn write_into_a_missing_directory_is_an_io_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/dir/out.safetensors");
    match write_atomic(&path, b"x") {
        Err(Error::Io { path: p, .. }) => assert_eq!(p, path),
        other => panic!("expected an Io error, got {other:?}"),
    }
}

#[test]
fn same_file_sees_paths_links_and_hard_links() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    std::fs::write(&a, b"1").unwrap();
    std::fs::write(&b, b"1").unwrap();
    let sym = dir.path().join("sym");
    let hard = dir.path().join("hard");
    std::os::unix::fs::symlink(&a, &sym).unwrap();
    std::fs::hard_link(&a, &hard).unwrap();
    let dotted = dir.path().join(".").join("a");
    assert!(same_file(&a, &a));
    assert!(same_file(&a, &dotted));
    assert!(same_file(&a, &sym));
    assert!(same_file(&hard, &a));
    assert!(!same_file(&a, &b), "equal contents are not the same file");
    assert!(!same_file(&a, &dir.path().join("missing")));
    assert!(check_not_an_input(&b, &[&a]).is_ok());
    match check_not_an_input(&sym, &[&b, &a]) {
        Err(Error::InvalidArgument { arg, rule }) => {
            assert_eq!(arg, "output");
            assert!(rule.contains("is the input file"), "{rule}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_new_file_is_0644_and_a_replaced_one_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let new = dir.path().join("new.json");
    write_atomic(&new, b"1").unwrap();
    assert_eq!(mode(&new), 0o644);
    let old = dir.path().join("old.json");
    std::fs::write(&old, b"0").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o664)).unwrap();
    write_atomic(&old, b"1").unwrap();
    assert_eq!(mode(&old), 0o664);
}
