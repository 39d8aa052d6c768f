//! Kernel parameter names, read from the `__global__` signatures of a CUDA source file, and a
//! kernel's plain name from its (possibly C++-mangled) symbol. The cubin records each
//! parameter's ordinal, offset and size but not its name, so `--secret-param q` is resolved here
//! to an ordinal. The reading is textual (comments and preprocessor lines removed, no macro
//! expansion), so anything it cannot see for certain is an error that asks for the ordinal,
//! never a guess.

/// One `__global__` function as written in the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// The function's name (without namespace qualifiers).
    pub name: String,
    /// Parameter names in order; `None` for an unnamed parameter.
    pub params: Vec<Option<String>>,
}

/// Identifiers followed by a parenthesised argument list that can stand between `__global__`
/// and the kernel's name.
const ATTRIBUTES: &[&str] = &[
    "__launch_bounds__",
    "__maxnreg__",
    "__cluster_dims__",
    "__attribute__",
    "__declspec",
    "alignas",
    "__align__",
    "decltype",
];

/// Words that end a parameter's type, never name it.
const TYPE_WORDS: &[&str] = &[
    "const",
    "volatile",
    "__restrict__",
    "__restrict",
    "restrict",
    "__grid_constant__",
    "unsigned",
    "signed",
    "int",
    "long",
    "short",
    "char",
    "float",
    "double",
    "bool",
    "void",
    "auto",
];

/// The source with comments, string and character literals blanked and preprocessor lines
/// (with their continuations) removed; line structure is kept.
fn strip(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let mut line_start = true;
    while i < b.len() {
        let c = b[i];
        if line_start && c == '#' {
            // Skip to the end of the logical line.
            while i < b.len() && b[i] != '\n' {
                if b[i] == '\\' && b.get(i + 1) == Some(&'\n') {
                    i += 1;
                    out.push('\n');
                }
                i += 1;
            }
            continue;
        }
        if c == '/' && b.get(i + 1) == Some(&'/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && b.get(i + 1) == Some(&'*') {
            i += 2;
            while i < b.len() && !(b[i] == '*' && b.get(i + 1) == Some(&'/')) {
                if b[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
            out.push(' ');
            continue;
        }
        if c == '"' || c == '\'' {
            i += 1;
            while i < b.len() && b[i] != c && b[i] != '\n' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str(" 0 ");
            continue;
        }
        if c == '\n' {
            line_start = true;
        } else if !c.is_whitespace() {
            line_start = false;
        }
        out.push(c);
        i += 1;
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Punct(char),
}

fn tokens(s: &str) -> Vec<Tok> {
    let b: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_alphabetic() || c == '_' {
            let st = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(b[st..i].iter().collect()));
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '.' || b[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident("0".into()));
        } else {
            if !c.is_whitespace() {
                out.push(Tok::Punct(c));
            }
            i += 1;
        }
    }
    out
}

/// Index just past the bracket that closes the one at `open`, or `None` when unbalanced.
fn close(t: &[Tok], open: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (j, tok) in t.iter().enumerate().skip(open) {
        match tok {
            Tok::Punct('(') | Tok::Punct('[') | Tok::Punct('{') => depth += 1,
            Tok::Punct(')') | Tok::Punct(']') | Tok::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    return Some(j + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The name a parameter declaration gives, if any.
fn param_name(decl: &[Tok]) -> Option<String> {
    // Drop a default argument (top-level `=`) and trailing array bounds.
    let mut d: &[Tok] = decl;
    if let Some(eq) = d.iter().position(|t| *t == Tok::Punct('=')) {
        d = &d[..eq];
    }
    while let Some(Tok::Punct(']')) = d.last() {
        let open = d.iter().rposition(|t| *t == Tok::Punct('['))?;
        d = &d[..open];
    }
    // A function pointer `T (*name)(args)`.
    if let Some(p) = d
        .windows(3)
        .position(|w| w[0] == Tok::Punct('(') && w[1] == Tok::Punct('*'))
    {
        if let Tok::Ident(n) = &d[p + 2] {
            return Some(n.clone());
        }
    }
    match d.last() {
        Some(Tok::Ident(n)) if d.len() >= 2 && !TYPE_WORDS.contains(&n.as_str()) => {
            // `ns::Type` alone names a type, not a parameter.
            let prev = &d[d.len() - 2];
            (*prev != Tok::Punct(':')).then(|| n.clone())
        }
        _ => None,
    }
}

fn split_params(t: &[Tok]) -> Vec<&[Tok]> {
    let mut out = Vec::new();
    let (mut depth, mut angle, mut st) = (0i32, 0i32, 0usize);
    for (j, tok) in t.iter().enumerate() {
        match tok {
            Tok::Punct('(') | Tok::Punct('[') | Tok::Punct('{') => depth += 1,
            Tok::Punct(')') | Tok::Punct(']') | Tok::Punct('}') => depth -= 1,
            Tok::Punct('<') => angle += 1,
            Tok::Punct('>') => angle = (angle - 1).max(0),
            Tok::Punct(',') if depth == 0 && angle == 0 => {
                out.push(&t[st..j]);
                st = j + 1;
            }
            _ => {}
        }
    }
    out.push(&t[st..]);
    out
}

/// Every `__global__` function signature in `src`, in order.
pub fn parse_signatures(src: &str) -> Vec<Signature> {
    let t = tokens(&strip(src));
    let mut out = Vec::new();
    for (g, tok) in t.iter().enumerate() {
        if *tok != Tok::Ident("__global__".into()) {
            continue;
        }
        let mut j = g + 1;
        let mut last: Option<&str> = None;
        while j < t.len() {
            match &t[j] {
                Tok::Ident(s) => {
                    last = Some(s);
                    j += 1;
                }
                Tok::Punct('(') => {
                    let Some(end) = close(&t, j) else { break };
                    match last {
                        Some(name) if !ATTRIBUTES.contains(&name) => {
                            let inner = &t[j + 1..end - 1];
                            let params = if inner.is_empty() || inner == [Tok::Ident("void".into())]
                            {
                                Vec::new()
                            } else {
                                split_params(inner).into_iter().map(param_name).collect()
                            };
                            out.push(Signature {
                                name: name.to_string(),
                                params,
                            });
                            break;
                        }
                        _ => {
                            last = None;
                            j = end;
                        }
                    }
                }
                Tok::Punct(';') | Tok::Punct('{') | Tok::Punct('}') => break,
                Tok::Punct(_) => j += 1,
            }
        }
    }
    out
}

/// Reads `<len><identifier>` at the start of `s`.
fn source_name(s: &str) -> Option<(&str, &str)> {
    let digits = s.bytes().take_while(|b| b.is_ascii_digit()).count();
    let n: usize = s.get(..digits)?.parse().ok()?;
    let rest = &s[digits..];
    Some((rest.get(..n)?, rest.get(n..)?))
}

/// A kernel's plain name from its symbol: the symbol itself for `extern "C"` kernels, the
/// function's own name (no namespaces, no template arguments) for Itanium-mangled ones
/// (`_Z6kernelPKfPfi` → `kernel`, `_ZN2ns6kernelIfEEvPT_` → `kernel`).
pub fn base_name(symbol: &str) -> &str {
    let Some(rest) = symbol.strip_prefix("_Z") else {
        return symbol;
    };
    let rest = rest.strip_prefix('L').unwrap_or(rest);
    if let Some(mut nested) = rest.strip_prefix('N') {
        let mut last = None;
        while let Some((name, after)) = source_name(nested) {
            last = Some(name);
            nested = after;
        }
        return last.unwrap_or(symbol);
    }
    source_name(rest).map(|(n, _)| n).unwrap_or(symbol)
}

/// The ordinal of the parameter called `param` in the kernel with symbol `symbol` and `count`
/// parameters: `Ok(Some(i))`, `Ok(None)` when that kernel has no parameter of the name, and an
/// error when its signature is not in the source or its declarations disagree.
pub fn param_ordinal(
    sigs: &[Signature],
    symbol: &str,
    count: usize,
    param: &str,
) -> Result<Option<usize>, String> {
    let name = base_name(symbol);
    let cands: Vec<&Signature> = sigs
        .iter()
        .filter(|s| s.name == name && s.params.len() == count)
        .collect();
    if cands.is_empty() {
        return Err(format!(
            "the signature of kernel `{symbol}` ({count} parameter(s)) is not written out in the source (a macro or another file?), so parameter names cannot be read for it; give --secret-param as a 0-based ordinal"
        ));
    }
    let positions: Vec<Option<usize>> = cands
        .iter()
        .map(|s| s.params.iter().position(|p| p.as_deref() == Some(param)))
        .collect();
    if positions.iter().all(|p| *p == positions[0]) {
        Ok(positions[0])
    } else {
        Err(format!(
            "kernel `{name}` is declared more than once with different parameter names, so `{param}` is ambiguous; give --secret-param as a 0-based ordinal"
        ))
    }
}

/// A parameter named on the command line (`--secret-param`, `--public-param`): a 0-based
/// ordinal or the parameter's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamSpec {
    Ordinal(usize),
    Name(String),
}

impl std::str::FromStr for ParamSpec {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            return s
                .parse()
                .map(ParamSpec::Ordinal)
                .map_err(|_| format!("`{s}` is too large for a parameter ordinal"));
        }
        let ident = s
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if ident {
            Ok(ParamSpec::Name(s.to_string()))
        } else {
            Err(format!(
                "`{s}` is neither a 0-based parameter ordinal nor a parameter name"
            ))
        }
    }
}

impl std::fmt::Display for ParamSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamSpec::Ordinal(n) => write!(f, "{n}"),
            ParamSpec::Name(s) => write!(f, "{s}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &Signature) -> Vec<String> {
        s.params
            .iter()
            .map(|p| p.clone().unwrap_or_else(|| "?".into()))
            .collect()
    }

    #[test]
    fn reads_signatures() {
        let src = r#"
#include <cuda_fp16.h>
#define K(x) __global__ void x(int a)
// __global__ void commented(int z)
/* __global__ void
   also_commented(int z) */
extern "C" __global__ void __launch_bounds__(128, 2)
attn(const __half* __restrict__ q, const __half* k, float scale, int n = 4, float* out[2]) {
  const char* s = "__global__ void fake(int y)";
}
template <typename T, int N>
__global__ void ns::tmpl(T* x, std::pair<int, int> p, void (*f)(int, int), unsigned int) {}
__global__ void none(void);
__global__ void empty();
"#;
        let sigs = parse_signatures(src);
        assert_eq!(sigs.len(), 4, "{sigs:?}");
        assert_eq!(sigs[0].name, "attn");
        assert_eq!(names(&sigs[0]), ["q", "k", "scale", "n", "out"]);
        assert_eq!(sigs[1].name, "tmpl");
        assert_eq!(names(&sigs[1]), ["x", "p", "f", "?"]);
        assert!(sigs[2].params.is_empty() && sigs[3].params.is_empty());
    }

    #[test]
    fn base_names() {
        assert_eq!(base_name("attn"), "attn");
        assert_eq!(base_name("_Z6kernelPKfPfi"), "kernel");
        assert_eq!(base_name("_ZN2ns6kernelIfEEvPT_"), "kernel");
        assert_eq!(base_name("_ZN12_GLOBAL__N_16kernelEPf"), "kernel");
        assert_eq!(base_name("_ZL4statPf"), "stat");
        assert_eq!(base_name("_Z"), "_Z");
        assert_eq!(base_name("_Z99x"), "_Z99x");
    }

    #[test]
    fn ordinals_by_name() {
        let sigs = parse_signatures(
            "__global__ void a(float* q, int n);\n__global__ void a(float* q, int n) {}\n\
             __global__ void b(int n, float* q) {}\n__global__ void c(int x, int y);\n\
             __global__ void c(int y, int x) {}",
        );
        assert_eq!(param_ordinal(&sigs, "a", 2, "n"), Ok(Some(1)));
        assert_eq!(param_ordinal(&sigs, "_Z1bifPf", 2, "n"), Ok(Some(0)));
        assert_eq!(param_ordinal(&sigs, "a", 2, "zz"), Ok(None));
        assert!(param_ordinal(&sigs, "a", 3, "n").is_err());
        assert!(param_ordinal(&sigs, "missing", 2, "n").is_err());
        assert!(param_ordinal(&sigs, "c", 2, "x")
            .unwrap_err()
            .contains("ambiguous"));
    }
}
