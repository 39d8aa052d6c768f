//! The library's modules depend on each other one way: this test reads every file under `src/`,
//! finds what each module imports from the crate (`crate::`, `super::`, `self::` and child-module
//! paths, in `use` items and inline), and checks two things:
//!
//! 1. no import cycle between modules. A module's children are parts of it and may use it
//!    (`super::`); every other edge counts, so two siblings that import each other, or a chain of
//!    modules that comes back to its start, fail;
//! 2. the top-level modules respect the layer order in [`LAYERS`]: a module imports only from its
//!    own layer or a lower one;
//! 3. no library module imports one of the [`TOOLS`] (the modules behind the `tools` feature).
//!
//! Code under `#[cfg(test)]` is left out: a unit test may reach any module it checks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules from the lowest layer to the highest. A module imports only from its own
/// layer or one below it (within a layer, the cycle check still applies).
const LAYERS: &[&[&str]] = &[
    // What a call is, and tools with no knowledge of attention.
    &["error", "spec", "abi", "knobs", "output"],
    &["jit", "reference", "tensor_io"],
    // The audit analyses any cubin; it knows no kernel of ours.
    &["audit"],
    // The kernel variants: sources, build options, what each declares to the audit.
    &["kernels"],
    // The shipped set's audit; the attention API (validate, plan, launch).
    &["shipped", "attention"],
    // Tools built on the library: benchmark, timing-leakage test, CLI input files.
    &["bench", "leakage", "tensor_io_kv"],
    &["cli"],
];

type Module = Vec<String>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file defines: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `lib.rs` the root.
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The source with comments, string and character literals blanked out (so a path in a doc
/// comment or a message is no import).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[char]| {
        for &ch in s {
            out.push(if ch == '\n' { '\n' } else { ' ' });
        }
    };
    while i < c.len() {
        let start = i;
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (c.get(i + 1) == Some(&'"') || c.get(i + 1) == Some(&'#'))
            && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_'))
        {
            // Raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{..}'); a lifetime ('a) has no closing quote.
            let close = if c.get(i + 1) == Some(&'\\') {
                (i + 2..c.len().min(i + 12)).find(|&j| c[j] == '\'')
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(j) => i = j + 1,
                None => {
                    out.push(c[i]);
                    i += 1;
                    continue;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
            continue;
        }
        blank(&mut out, &c[start..i.min(c.len())]);
    }
    out
}

/// `code` without the items marked `#[cfg(test)]` (a `mod tests { .. }`, a `use`, a function).
fn without_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        // The item ends at its first `;` outside braces, or at the brace closing its body.
        let mut depth = 0usize;
        let mut end = item.len();
        for (k, ch) in item.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

/// Expands the path (or `use` tree) starting at byte `at` of `code` into full paths.
fn paths_at(code: &str, at: usize) -> Vec<Vec<String>> {
    fn tree(s: &[char], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        loop {
            while *i < s.len() && s[*i].is_whitespace() {
                *i += 1;
            }
            if *i < s.len() && s[*i] == '{' {
                *i += 1;
                loop {
                    while *i < s.len() && (s[*i].is_whitespace() || s[*i] == ',') {
                        *i += 1;
                    }
                    if *i >= s.len() || s[*i] == '}' {
                        *i += 1;
                        return;
                    }
                    tree(s, i, path.clone(), out);
                }
            }
            let start = *i;
            while *i < s.len() && is_ident(s[*i]) {
                *i += 1;
            }
            if *i == start {
                // `*` or the end of the path.
                out.push(path);
                return;
            }
            path.push(s[start..*i].iter().collect());
            let mut j = *i;
            while j < s.len() && s[j].is_whitespace() {
                j += 1;
            }
            if s.get(j) == Some(&':') && s.get(j + 1) == Some(&':') {
                *i = j + 2;
            } else {
                out.push(path);
                return;
            }
        }
    }
    let s: Vec<char> = code[at..].chars().take(4000).collect();
    let mut out = Vec::new();
    let mut i = 0;
    tree(&s, &mut i, Vec::new(), &mut out);
    out
}

/// The modules `module` imports, by the paths in its code.
fn imports(module: &Module, code: &str, modules: &BTreeSet<Module>) -> BTreeSet<Module> {
    let children: BTreeSet<String> = modules
        .iter()
        .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
        .map(|m| m.last().unwrap().clone())
        .collect();
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut k = 0;
    while k < code.len() {
        if !code.is_char_boundary(k) || !is_ident(bytes[k] as char) {
            k += 1;
            continue;
        }
        let end = k + code[k..]
            .find(|ch: char| !is_ident(ch))
            .unwrap_or(code.len() - k);
        let word = &code[k..end];
        let prev = code[..k].trim_end();
        let after_sep = prev.ends_with("::") || prev.ends_with('.');
        let next_is_path = code[end..].trim_start().starts_with("::");
        let is_root = matches!(word, "crate" | "super" | "self") || children.contains(word);
        if is_root && !after_sep && next_is_path {
            for path in paths_at(code, k) {
                let mut base: Vec<String> = match path[0].as_str() {
                    "crate" => Vec::new(),
                    _ => module.clone(),
                };
                let mut segs = &path[..];
                if segs[0] == "crate" || segs[0] == "self" {
                    segs = &segs[1..];
                }
                while segs.first().is_some_and(|s| s == "super") {
                    base.pop();
                    segs = &segs[1..];
                }
                let mut full = base;
                full.extend(segs.iter().cloned());
                // The longest prefix that is a module is what the path imports.
                while !full.is_empty() && !modules.contains(&full) {
                    full.pop();
                }
                found.insert(full);
            }
        }
        k = end;
    }
    // A module's children are parts of it: their use of it (or of an ancestor) is no edge.
    found.retain(|t| !t.is_empty() && t != module && !module.starts_with(t));
    found
}

fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
    // `LAYERS_SRC=DIR` checks another tree (e.g. an older commit's `src/`, to see the checker fail).
    let src = std::env::var_os("LAYERS_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // main.rs is the binary crate: it imports the library as `flashcore::`, never `crate::`.
    files.retain(|f| f.file_name().is_some_and(|n| n != "main.rs") || f.parent() != Some(&src));
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(&src, f)).collect();
    files
        .iter()
        .map(|f| {
            let m = module_of(&src, f);
            let code = without_test_items(&code_only(&std::fs::read_to_string(f).unwrap()));
            let deps = imports(&m, &code, &modules);
            (m, deps)
        })
        .collect()
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Strongly connected components of more than one module (Tarjan).
fn cycles(g: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a Module) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let Some((w, _)) = t.g.get_key_value(w) else {
                continue;
            };
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                comp.push(name(w));
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn the_checker_sees_imports() {
    // Guards against a vacuous pass: known edges of each kind must be found.
    let g = graph();
    let has = |from: &str, to: &str| {
        let f: Module = from.split("::").map(String::from).collect();
        let t: Module = to.split("::").map(String::from).collect();
        g.get(&f).is_some_and(|d| d.contains(&t))
    };
    assert!(
        has("attention::launch", "kernels"),
        "a `use crate::..` item"
    );
    assert!(
        has("attention::launch", "attention::decode"),
        "a `use super::{{..}}` tree"
    );
    assert!(
        has("attention::external", "attention::external::varlen"),
        "a child module path"
    );
    assert!(has("shipped", "audit"), "an imported function");
    assert!(g.len() > 80, "{} modules", g.len());
    // Comments and strings are no imports.
    let code = code_only("// crate::a::b\nlet s = \"crate::c\"; let c = '\"'; use crate::d;");
    assert!(!code.contains("crate::a") && !code.contains("crate::c") && code.contains("crate::d"));
}

#[test]
fn no_import_cycles() {
    let c = cycles(&graph());
    assert!(
        c.is_empty(),
        "modules that import each other in a circle: {c:#?}"
    );
}

#[test]
fn top_level_modules_import_only_their_layer_or_below() {
    let layer_of = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
    let mut wrong = Vec::new();
    for (from, deps) in graph() {
        let Some(top) = from.first() else {
            continue; // lib.rs: declares and re-exports every module
        };
        let from_layer = layer_of(top).unwrap_or_else(|| panic!("`{top}` has no layer in LAYERS"));
        for to in deps {
            let to_layer = layer_of(&to[0]).unwrap_or_else(|| panic!("`{}` has no layer", to[0]));
            if to_layer > from_layer {
                wrong.push(format!(
                    "{} imports {} (a higher layer)",
                    name(&from),
                    name(&to)
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The modules behind the `tools` feature (src/lib.rs): the binary's parts, which the Python and
/// candle crates build without.
const TOOLS: &[&str] = &[
    "bench",
    "cli",
    "leakage",
    "output",
    "tensor_io",
    "tensor_io_kv",
];

#[test]
fn the_library_imports_no_tool() {
    let mut wrong = Vec::new();
    for (from, deps) in graph() {
        let Some(top) = from.first() else {
            continue;
        };
        if TOOLS.contains(&top.as_str()) {
            continue;
        }
        for to in deps.iter().filter(|t| TOOLS.contains(&t[0].as_str())) {
            wrong.push(format!("{} imports the tool {}", name(&from), name(to)));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Every tool module is the one lib.rs declares behind the feature, and only those.
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    let gated: Vec<&str> = lib
        .split("#[cfg(feature = \"tools\")]")
        .skip(1)
        .filter_map(|rest| rest.trim_start().strip_prefix("pub mod "))
        .filter_map(|rest| rest.split(';').next())
        .collect();
    assert_eq!(
        gated, TOOLS,
        "src/lib.rs's modules behind the `tools` feature"
    );
}

/// The Python extension and the candle crate build the library alone: they turn the default
/// `tools` feature off, and the dependencies only the tools use are optional and part of it.
#[test]
fn python_and_candle_build_without_the_tools() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    for krate in ["python/Cargo.toml", "flashcore-candle/Cargo.toml"] {
        let toml = read(krate);
        let dep = toml
            .lines()
            .find(|l| l.starts_with("flashcore = "))
            .unwrap_or_else(|| panic!("{krate}: no flashcore dependency"));
        assert!(
            dep.contains("default-features = false"),
            "{krate}: `{dep}` builds the tools too"
        );
    }
    let toml = read("Cargo.toml");
    let tools = toml
        .lines()
        .find(|l| l.starts_with("tools = ["))
        .expect("Cargo.toml: a `tools` feature");
    for name in ["clap", "plotters", "indicatif"] {
        let dep = toml
            .lines()
            .find(|l| l.starts_with(&format!("{name} = ")))
            .unwrap_or_else(|| panic!("Cargo.toml: no {name}"));
        assert!(dep.contains("optional = true"), "{name} is not optional");
        assert!(
            tools.contains(&format!("\"dep:{name}\"")),
            "{name} is not in the tools feature"
        );
    }
}
