//! Source lines in an nvdisasm listing: with `-gi`, a cubin built with `-lineinfo` is printed
//! with a comment before each run of instructions from one line,
//! `//## File "/path/k.cu", line 12` — and, where the compiler inlined a function,
//! `//## File "/path/cuda_fp16.hpp", line 300 inlined at "/path/k.cu", line 12`.

use std::fmt;

/// A source position, with the call sites it was inlined at (innermost first).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SrcLoc {
    pub file: String,
    pub line: u32,
    /// Where the function holding this line was inlined, innermost call first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inlined_at: Vec<(String, u32)>,
}

impl SrcLoc {
    /// The outermost position: the line in the function the user wrote the call in, which is
    /// where a user fixes a leak in code inlined from a header.
    pub fn outermost(&self) -> (&str, u32) {
        self.inlined_at
            .last()
            .map(|(f, l)| (f.as_str(), *l))
            .unwrap_or((self.file.as_str(), self.line))
    }
}

impl fmt::Display for SrcLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)?;
        for (file, line) in &self.inlined_at {
            write!(f, " (inlined at {file}:{line})")?;
        }
        Ok(())
    }
}

/// `"path", line N` at the start of `s` → (path, N, rest).
fn file_line(s: &str) -> Option<(String, u32, &str)> {
    let s = s.trim_start().strip_prefix('"')?;
    let end = s.find('"')?;
    let file = s[..end].to_string();
    let rest = s[end + 1..].trim_start().strip_prefix(',')?.trim_start();
    let rest = rest.strip_prefix("line")?.trim_start();
    let digits = rest.bytes().take_while(|b| b.is_ascii_digit()).count();
    let line = rest[..digits].parse().ok()?;
    Some((file, line, &rest[digits..]))
}

/// Parses one trimmed listing line if it is a line-info comment.
pub fn parse(t: &str) -> Option<SrcLoc> {
    let rest = t.strip_prefix("//##")?.trim_start().strip_prefix("File")?;
    let (file, line, mut rest) = file_line(rest)?;
    let mut inlined_at = Vec::new();
    while let Some(r) = rest.trim_start().strip_prefix("inlined at") {
        let (f, l, r) = file_line(r)?;
        inlined_at.push((f, l));
        rest = r;
    }
    Some(SrcLoc {
        file,
        line,
        inlined_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_inlined() {
        let a = parse(r#"//## File "/tmp/k.cu", line 12"#).unwrap();
        assert_eq!((a.file.as_str(), a.line), ("/tmp/k.cu", 12));
        assert_eq!(a.to_string(), "/tmp/k.cu:12");
        let b = parse(r#"//## File "/i/cuda_fp16.hpp", line 300 inlined at "/tmp/k.cu", line 6"#)
            .unwrap();
        assert_eq!(b.inlined_at, vec![("/tmp/k.cu".to_string(), 6)]);
        assert_eq!(b.outermost(), ("/tmp/k.cu", 6));
        assert_eq!(
            b.to_string(),
            "/i/cuda_fp16.hpp:300 (inlined at /tmp/k.cu:6)"
        );
        assert!(parse("// plain comment").is_none());
        assert!(parse(r#"//## File "unterminated, line 3"#).is_none());
        assert!(parse(r#"//## File "/k.cu", line x"#).is_none());
    }
}
