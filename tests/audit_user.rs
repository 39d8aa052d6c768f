//! `flashcore audit` on users' kernels: toolkit headers, `-I`/`-D`/`--std`/`--arch`,
//! `--kernel`, `--secret-param` by name, `--cubin` of what nvcc builds (a real nvcc fat binary,
//! and the same inside an ELF object), findings on source lines, and every error path (exit 2
//! with a message). Needs NVRTC, nvdisasm, cuobjdump and the toolkit headers
//! (`bash scripts/install-cuda-tools.sh`); fails, never skips, without them.

mod common;
use common::flashcore;
use serde_json::Value;

fn corpus(f: &str) -> String {
    format!("{}/tests/audit_corpus/{f}", env!("CARGO_MANIFEST_DIR"))
}

const HEADERS: &str = "user/headers.cu";
const MULTI: &str = "nvcc/multi.cu";
const FATBIN: &str = "nvcc/multi.fatbin";

/// The 1-based line of `file` holding `marker`.
fn line_of(file: &str, marker: &str) -> u64 {
    let text = std::fs::read_to_string(corpus(file)).unwrap();
    text.lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("{marker} not in {file}")) as u64
        + 1
}

/// Runs `flashcore audit --json ARGS`: (exit code, kernels by plain name, stderr).
fn audit_json(args: &[&str]) -> (i32, Vec<Value>, String) {
    let mut all = vec!["audit", "--json"];
    all.extend_from_slice(args);
    let (code, out, err) = flashcore(&all);
    let v: Value = if code == 2 {
        Value::Array(vec![])
    } else {
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"))
    };
    (code, v.as_array().cloned().unwrap_or_default(), err)
}

/// Kernel plain name → number of findings (the name is found inside the possibly mangled
/// symbol).
fn verdicts(kernels: &[Value], names: &[&str]) -> Vec<(String, usize)> {
    names
        .iter()
        .map(|n| {
            let k = kernels
                .iter()
                .find(|k| {
                    let s = k["name"].as_str().unwrap();
                    s == *n || s.contains(&format!("{}{n}", n.len()))
                })
                .unwrap_or_else(|| panic!("kernel {n} not audited: {kernels:?}"));
            (n.to_string(), k["findings"].as_array().unwrap().len())
        })
        .collect()
}

/// Asserts exit code 2 and that stderr holds every one of `needles`.
fn refused(args: &[&str], needles: &[&str]) {
    let (code, out, err) = flashcore(args);
    assert_eq!(code, 2, "{args:?}: exit {code}\n{out}\n{err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr lacks {n:?}:\n{err}");
    }
}

#[test]
fn kernels_including_fp16_and_bf16_headers_audit_clean_and_leaky() {
    let (code, ks, err) = audit_json(&["--source", &corpus(HEADERS)]);
    assert_eq!(code, 1, "{err}");
    let v = verdicts(
        &ks,
        &[
            "scale_half",
            "sum_bf16",
            "prefix_len",
            "barrier_copy",
            "relu_branch",
        ],
    );
    for (name, n) in &v {
        if name == "relu_branch" {
            assert!(*n >= 1, "{v:?}");
        } else {
            assert_eq!(*n, 0, "{name} should be clean: {v:?}");
        }
    }
}

#[test]
fn a_define_selects_the_planted_leak_and_it_is_caught_only_then() {
    let src = corpus(HEADERS);
    let (code, ks, err) = audit_json(&["--source", &src, "--kernel", "sum_bf16"]);
    assert_eq!((code, ks.len()), (0, 1), "{err}");
    let (code, ks, err) =
        audit_json(&["--source", &src, "--kernel", "sum_bf16", "-D", "PLANT_LEAK"]);
    assert_eq!((code, ks.len()), (1, 1), "{err}");
    let f = &ks[0]["findings"][0];
    assert_eq!(f["rule_number"], 1, "{f}");
    assert_eq!(
        f["source"]["line"].as_u64(),
        Some(line_of(HEADERS, "PLANTED-LEAK-LINE")),
        "{f}"
    );
    // The long form and NAME=VALUE work the same way.
    let (code, _, err) = audit_json(&[
        "--source",
        &src,
        "--kernel",
        "sum_bf16",
        "--define",
        "PLANT_LEAK=1",
        "--std",
        "c++20",
        "--arch",
        "sm_90a",
    ]);
    assert_eq!(code, 1, "{err}");
}

#[test]
fn findings_and_their_taint_chains_name_source_lines() {
    let (code, out, err) = flashcore(&[
        "audit",
        "--source",
        &corpus(HEADERS),
        "--kernel",
        "relu_branch",
    ]);
    assert_eq!(code, 1, "{err}");
    let want = format!("headers.cu:{}", line_of(HEADERS, "BRANCH-LEAK-LINE"));
    let sink = out
        .lines()
        .find(|l| l.contains("EXIT") || l.contains("BRA"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        sink.contains(&want),
        "sink line lacks {want}: {sink}\n{out}"
    );
    // The chain starts at the load, on the line that reads x.
    let load = out
        .lines()
        .find(|l| l.contains("LDG"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        load.contains(&format!(
            "headers.cu:{}",
            line_of(HEADERS, "float v = __bfloat162float(x[threadIdx.x])")
        )),
        "{load}"
    );
}

#[test]
fn a_lineinfo_cubin_gives_source_lines_through_cubin_too() {
    let src = std::fs::read_to_string(corpus(HEADERS)).unwrap();
    let cubin = flashcore::audit::source::compile(
        std::path::Path::new(&corpus(HEADERS)),
        &src,
        &flashcore::audit::source::SourceOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("headers.cubin");
    std::fs::write(&p, cubin).unwrap();
    let (code, ks, err) = audit_json(&["--cubin", p.to_str().unwrap(), "--kernel", "relu_branch"]);
    assert_eq!(code, 1, "{err}");
    let f = &ks[0]["findings"][0];
    assert!(
        f["source"]["file"]
            .as_str()
            .unwrap()
            .ends_with("headers.cu"),
        "{f}"
    );
    assert_eq!(
        f["source"]["line"].as_u64(),
        Some(line_of(HEADERS, "BRANCH-LEAK-LINE"))
    );
    let chain = f["chain"].as_array().unwrap();
    assert!(
        !chain.is_empty() && chain.iter().all(|s| s["source"]["line"].is_u64()),
        "{f}"
    );
}

#[test]
fn secret_param_by_name_equals_by_ordinal() {
    let src = corpus(HEADERS);
    let base = ["--source", src.as_str(), "--kernel", "prefix_len"];
    let (code, _, err) = audit_json(&base);
    assert_eq!(code, 0, "{err}");
    for spec in ["len", "2"] {
        let mut a = base.to_vec();
        a.extend(["--secret-param", spec]);
        let (code, ks, err) = audit_json(&a);
        assert_eq!(code, 1, "--secret-param {spec}: {err}");
        assert_eq!(ks[0]["secret_params"], serde_json::json!([2]), "{spec}");
    }
}

#[test]
fn an_nvcc_fat_binary_audits_with_nvrtcs_verdicts() {
    let names = ["clean_scale", "leak_branch", "sum_len"];
    let (code, nvrtc, err) = audit_json(&["--source", &corpus(MULTI), "-D", "NO_HOST_CODE"]);
    assert_eq!(code, 1, "{err}");
    let want = verdicts(&nvrtc, &names);
    let (code, all, err) = audit_json(&["--cubin", &corpus(FATBIN)]);
    assert_eq!(code, 1, "{err}");
    // Two architectures, each audit labelled with its own.
    let archs: std::collections::BTreeSet<&str> =
        all.iter().map(|k| k["variant"].as_str().unwrap()).collect();
    assert_eq!(archs.into_iter().collect::<Vec<_>>(), ["sm_80", "sm_90a"]);
    let (code, nvcc, err) = audit_json(&["--cubin", &corpus(FATBIN), "--arch", "sm_90a"]);
    assert_eq!((code, nvcc.len()), (1, 3), "{err}");
    let got = verdicts(&nvcc, &names);
    let clean = |v: &[(String, usize)]| {
        v.iter()
            .map(|(n, f)| (n.clone(), *f == 0))
            .collect::<Vec<_>>()
    };
    assert_eq!(clean(&got), clean(&want));
    assert_eq!(
        clean(&got),
        [
            ("clean_scale".into(), true),
            ("leak_branch".into(), false),
            ("sum_len".into(), true)
        ]
    );
    // nvcc's line table points at the same line.
    let f = &nvcc.iter().find(|k| k["name"] == "leak_branch").unwrap()["findings"][0];
    assert!(
        f["source"]["file"].as_str().unwrap().ends_with("multi.cu"),
        "{f}"
    );
    assert_eq!(
        f["source"]["line"].as_u64(),
        Some(line_of(MULTI, "LEAK-LINE"))
    );
    // Parameter names for a cubin come from the source given with --signatures.
    let by_name = [
        "--cubin",
        &corpus(FATBIN),
        "--arch",
        "sm_90a",
        "--kernel",
        "sum_len",
        "--secret-param",
        "len",
        "--signatures",
        &corpus(MULTI),
    ];
    let (code, ks, err) = audit_json(&by_name);
    assert_eq!(code, 1, "{err}");
    assert_eq!(ks[0]["secret_params"], serde_json::json!([2]));
}

/// A minimal x86-64 ELF relocatable object whose only content is a `.nv_fatbin` section, the
/// way `nvcc -c` embeds device code in a host object.
fn elf_object_with_fatbin(fatbin: &[u8]) -> Vec<u8> {
    let shstrtab = b"\0.nv_fatbin\0.shstrtab\0";
    let data_off = 64usize;
    let str_off = data_off + fatbin.len();
    let sh_off = (str_off + shstrtab.len()).next_multiple_of(8);
    let mut e = vec![0u8; sh_off];
    e[..4].copy_from_slice(b"\x7fELF");
    e[4] = 2; // 64-bit
    e[5] = 1; // little-endian
    e[6] = 1; // version
    e[0x10..0x12].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
    e[0x12..0x14].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    e[0x14..0x18].copy_from_slice(&1u32.to_le_bytes());
    e[0x28..0x30].copy_from_slice(&(sh_off as u64).to_le_bytes());
    e[0x34..0x36].copy_from_slice(&64u16.to_le_bytes()); // ehsize
    e[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes()); // shentsize
    e[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes()); // shnum
    e[0x3e..0x40].copy_from_slice(&2u16.to_le_bytes()); // shstrndx
    e[data_off..str_off].copy_from_slice(fatbin);
    e[str_off..str_off + shstrtab.len()].copy_from_slice(shstrtab);
    let sh = |name: u32, typ: u32, flags: u64, off: usize, size: usize, align: u64| {
        let mut h = vec![0u8; 64];
        h[0..4].copy_from_slice(&name.to_le_bytes());
        h[4..8].copy_from_slice(&typ.to_le_bytes());
        h[8..16].copy_from_slice(&flags.to_le_bytes());
        h[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
        h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
        h[0x30..0x38].copy_from_slice(&align.to_le_bytes());
        h
    };
    e.extend(vec![0u8; 64]);
    e.extend(sh(1, 1, 2, data_off, fatbin.len(), 8));
    e.extend(sh(12, 3, 0, str_off, shstrtab.len(), 1));
    e
}

#[test]
fn a_fat_binary_inside_an_elf_object_is_found() {
    let fatbin = std::fs::read(corpus(FATBIN)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let obj = dir.path().join("multi.o");
    std::fs::write(&obj, elf_object_with_fatbin(&fatbin)).unwrap();
    let (code, ks, err) = audit_json(&["--cubin", obj.to_str().unwrap(), "--arch", "sm_90a"]);
    assert_eq!(code, 1, "{err}");
    let v = verdicts(&ks, &["clean_scale", "leak_branch", "sum_len"]);
    assert_eq!(
        v.iter().map(|(_, n)| *n == 0).collect::<Vec<_>>(),
        [true, false, true],
        "{v:?}"
    );
}

#[test]
fn bad_flags_exit_2_with_a_message() {
    let src = corpus(HEADERS);
    let s = src.as_str();
    refused(
        &["audit", "--source", s, "-D", "1X"],
        &["not a macro definition"],
    );
    refused(
        &["audit", "--source", s, "--std", "c++98"],
        &["c++98", "c++17"],
    );
    refused(
        &["audit", "--source", s, "--arch", "sm90"],
        &["not a SASS architecture"],
    );
    refused(
        &["audit", "-I", "/tmp", "--cubin", &corpus(FATBIN)],
        &["-I/--include-dir needs --source"],
    );
    refused(&["audit", "--std", "c++14"], &["--std needs --source"]);
    refused(
        &["audit", "--source", s, "--signatures", s],
        &["--signatures needs --cubin"],
    );
    refused(
        &["audit", "--source", s, "--secret-param", "a-b"],
        &["neither a 0-based parameter ordinal nor a parameter name"],
    );
    refused(&["audit", "--kernel", "x"], &["--kernel needs --source"]);
}

#[test]
fn a_missing_include_directory_is_named() {
    refused(
        &[
            "audit",
            "--source",
            &corpus(HEADERS),
            "-I",
            "/no/such/include/dir",
        ],
        &["/no/such/include/dir", "does not exist"],
    );
}

#[test]
fn a_missing_header_gets_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("needs_header.cu");
    std::fs::write(
        &p,
        "#include \"not_there.h\"\n__global__ void k(float* x) { x[0] = 1.f; }\n",
    )
    .unwrap();
    refused(
        &["audit", "--source", p.to_str().unwrap()],
        &["not_there.h", "hint:", "-I DIR"],
    );
    // ... and `-I` finds a header of the user's own.
    std::fs::write(dir.path().join("not_there.h"), "#define SCALE 2.f\n").unwrap();
    let inc = dir.path().join("inc");
    std::fs::create_dir(&inc).unwrap();
    std::fs::rename(dir.path().join("not_there.h"), inc.join("not_there.h")).unwrap();
    let (code, _, err) = flashcore(&[
        "audit",
        "--source",
        p.to_str().unwrap(),
        "-I",
        inc.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn an_unknown_kernel_name_lists_the_kernels() {
    refused(
        &[
            "audit",
            "--source",
            &corpus(HEADERS),
            "--kernel",
            "no_such_kernel",
        ],
        &["--kernel no_such_kernel: no such kernel", "relu_branch"],
    );
    refused(
        &[
            "audit",
            "--cubin",
            &corpus(FATBIN),
            "--kernel",
            "no_such_kernel",
        ],
        &["no such kernel", "leak_branch"],
    );
}

#[test]
fn an_unknown_secret_param_name_is_refused() {
    refused(
        &[
            "audit",
            "--source",
            &corpus(HEADERS),
            "--kernel",
            "prefix_len",
            "--secret-param",
            "lenn",
        ],
        &[
            "--secret-param lenn",
            "no audited kernel has a parameter of that name",
            "prefix_len(x, out, len)",
        ],
    );
}

#[test]
fn a_parameter_name_for_a_cubin_needs_the_source() {
    refused(
        &["audit", "--cubin", &corpus(FATBIN), "--secret-param", "len"],
        &["does not record parameter names", "ordinal"],
    );
}

#[test]
fn a_file_without_a_cubin_inside_is_refused() {
    // A host executable with no device code: this test binary.
    let me = std::env::current_exe().unwrap();
    refused(
        &["audit", "--cubin", me.to_str().unwrap()],
        &["holds no cubin"],
    );
    // Text is no container at all.
    refused(
        &["audit", "--cubin", &corpus(MULTI)],
        &["neither a cubin", "nvcc -cubin"],
    );
    // A fat binary without the asked-for architecture.
    refused(
        &["audit", "--cubin", &corpus(FATBIN), "--arch", "sm_75"],
        &["no cubin for sm_75", "sm_90a"],
    );
}

#[test]
fn line_info_does_not_change_the_code() {
    // docs/security.md says so: the verdict of a -lineinfo build is the verdict of the plain build.
    use flashcore::audit::{disassemble, source};
    let path = corpus(HEADERS);
    let src = std::fs::read_to_string(&path).unwrap();
    let build = |lineinfo: bool| {
        let opts = source::SourceOptions {
            lineinfo,
            defines: vec!["PLANT_LEAK".into()],
            ..Default::default()
        };
        let cubin = source::compile(std::path::Path::new(&path), &src, &opts)
            .unwrap_or_else(|e| panic!("{e}"));
        let listing = disassemble(&cubin).unwrap_or_else(|e| panic!("{e}"));
        let insns: Vec<String> = listing
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("/*"))
            .map(String::from)
            .collect();
        (insns, listing.contains("//## File"))
    };
    let (with, has_lines) = build(true);
    let (without, no_lines) = build(false);
    assert!(has_lines && !no_lines);
    assert!(with.len() > 50, "{}", with.len());
    assert_eq!(with, without);
}

#[test]
fn help_states_the_default_secrets_and_the_nvcc_line() {
    let (code, out, err) = flashcore(&["audit", "--help"]);
    assert_eq!(code, 0, "{err}");
    for needle in [
        "everything a kernel reads from global memory",
        "parameter values",
        "--secret-param <N|NAME>",
        "nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -lineinfo",
        "-I, --include-dir",
        "-D, --define",
    ] {
        assert!(out.contains(needle), "--help lacks {needle:?}:\n{out}");
    }
}
