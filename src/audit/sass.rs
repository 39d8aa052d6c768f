//! SASS text (as `nvdisasm -c` prints it) → instructions with typed operands.
//!
//! One cubin may hold several kernels, each in its own `.text.<kernel>` section whose offsets
//! start at 0; a section may also hold internal subroutines (e.g. the IEEE division slow path)
//! that the kernel reaches with `CALL.REL`. [`parse_listing`] returns one [`Section`] per kernel.

use std::collections::HashMap;

/// A register-like storage location that the taint analysis tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reg {
    /// General register R0..R254 (RZ is [`Reg::Zero`]).
    R(u8),
    /// Uniform register UR0..UR62 (URZ is [`Reg::Zero`]).
    UR(u8),
    /// Predicate P0..P6 (PT is [`Reg::True`]).
    P(u8),
    /// Uniform predicate UP0..UP6 (UPT is [`Reg::True`]).
    UP(u8),
    /// RZ / URZ / SRZ: constant zero.
    Zero,
    /// PT / UPT: constant true.
    True,
    /// `PR`: all predicates at once (P2R / R2P).
    PR,
    /// `UPR`: all uniform predicates at once.
    UPR,
}

impl Reg {
    pub fn is_pred(&self) -> bool {
        matches!(
            self,
            Reg::P(_) | Reg::UP(_) | Reg::True | Reg::PR | Reg::UPR
        )
    }
    pub fn is_gpr(&self) -> bool {
        matches!(self, Reg::R(_) | Reg::UR(_) | Reg::Zero)
    }
    /// The `n`-th register of a pair/quad/range starting here (R2.64 → R2, R3).
    pub fn offset(&self, n: usize) -> Option<Reg> {
        match *self {
            Reg::R(i) => {
                let j = i as usize + n;
                (j < 255).then_some(Reg::R(j as u8))
            }
            Reg::UR(i) => {
                let j = i as usize + n;
                (j < 63).then_some(Reg::UR(j as u8))
            }
            Reg::Zero => Some(Reg::Zero),
            other => (n == 0).then_some(other),
        }
    }
}

impl std::fmt::Display for Reg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reg::R(i) => write!(f, "R{i}"),
            Reg::UR(i) => write!(f, "UR{i}"),
            Reg::P(i) => write!(f, "P{i}"),
            Reg::UP(i) => write!(f, "UP{i}"),
            Reg::Zero => write!(f, "RZ"),
            Reg::True => write!(f, "PT"),
            Reg::PR => write!(f, "PR"),
            Reg::UPR => write!(f, "UPR"),
        }
    }
}

/// Parses a bare register name (`R12`, `UR4`, `P3`, `UPT`, `RZ`, `PR`). Suffixes must be stripped.
pub fn parse_reg(s: &str) -> Option<Reg> {
    match s {
        "RZ" | "URZ" | "SRZ" => return Some(Reg::Zero),
        "PT" | "UPT" => return Some(Reg::True),
        "PR" => return Some(Reg::PR),
        "UPR" => return Some(Reg::UPR),
        _ => {}
    }
    let num = |p: &str| -> Option<u8> {
        let rest = s.strip_prefix(p)?;
        if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        rest.parse::<u16>().ok().and_then(|v| u8::try_from(v).ok())
    };
    if let Some(n) = num("UR") {
        return Some(if n >= 63 { Reg::Zero } else { Reg::UR(n) });
    }
    if let Some(n) = num("UP") {
        return Some(if n >= 7 { Reg::True } else { Reg::UP(n) });
    }
    if let Some(n) = num("R") {
        return Some(if n == 255 { Reg::Zero } else { Reg::R(n) });
    }
    if let Some(n) = num("P") {
        return Some(if n >= 7 { Reg::True } else { Reg::P(n) });
    }
    None
}

/// A register operand with its explicit width suffix (`R2.64` → width 2) and negation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegOp {
    pub reg: Reg,
    /// Registers covered by an explicit `.64` / `.128` suffix (1 when none).
    pub width: usize,
    /// `!P0`, `-R2`, `~R3`, `|R4|`.
    pub negated: bool,
}

/// One operand of an instruction.
#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    Reg(RegOp),
    /// A memory reference: `[R2.64+0x10]`, `desc[UR4][R2.64]`, `gdesc[UR4]`, `[UR8+0x400]`.
    /// `prefix` is `""`, `desc`, `gdesc`, ...; `desc` holds the registers of a `desc[...]` /
    /// `gdesc[...]` group, `addr` those of the address group(s).
    Mem {
        prefix: String,
        desc: Vec<RegOp>,
        addr: Vec<RegOp>,
        imm: i64,
    },
    /// Constant bank `c[0x0][0x218]`, possibly register-indexed (`c[0x0][R2+0x10]`, `cx[UR4][..]`).
    CBank {
        bank: Option<u32>,
        offset: i64,
        index: Vec<RegOp>,
    },
    /// Integer or floating immediate.
    Imm(String),
    /// A code target: `` `(.L_x_3) `` or `` `($__internal_0_$__cuda_sm20_div_s64) ``.
    Label(String),
    /// Special registers (SR_TID.X), scoreboard names, `gsb0`, anything else.
    Other(String),
}

impl Operand {
    pub fn as_reg(&self) -> Option<&RegOp> {
        match self {
            Operand::Reg(r) => Some(r),
            _ => None,
        }
    }
    pub fn is_mem(&self) -> bool {
        matches!(self, Operand::Mem { .. })
    }
}

/// A guard predicate `@P0` / `@!UP1` (absent or `@PT` means always).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guard {
    pub reg: Reg,
    pub negated: bool,
}

/// One SASS instruction.
#[derive(Debug, Clone, PartialEq)]
pub struct Insn {
    pub offset: u32,
    pub guard: Option<Guard>,
    /// Full opcode with modifiers, e.g. `LDG.E.128.CONSTANT`.
    pub opcode: String,
    pub operands: Vec<Operand>,
    /// The instruction as printed (guard, opcode, operands), without offset and `;`.
    pub text: String,
}

impl Insn {
    /// Base opcode without modifiers (`LDG` for `LDG.E.128`).
    pub fn op(&self) -> &str {
        self.opcode.split('.').next().unwrap_or("")
    }
    /// Modifiers after the base opcode.
    pub fn mods(&self) -> impl Iterator<Item = &str> {
        self.opcode.split('.').skip(1)
    }
    pub fn has_mod(&self, m: &str) -> bool {
        self.mods().any(|x| x == m)
    }
    /// A guard that is not the constant-true predicate.
    pub fn real_guard(&self) -> Option<Guard> {
        self.guard.filter(|g| g.reg != Reg::True || g.negated)
    }
    pub fn label_target(&self) -> Option<&str> {
        self.operands.iter().find_map(|o| match o {
            Operand::Label(l) => Some(l.as_str()),
            _ => None,
        })
    }
}

/// The code of one kernel's `.text` section: instructions in offset order, local labels, and
/// the functions (kernel entry first, then subroutines) with their start indices.
#[derive(Debug, Clone, Default)]
pub struct Section {
    pub kernel: String,
    pub insns: Vec<Insn>,
    /// Label → index of the instruction it precedes (`insns.len()` when at the end).
    pub labels: HashMap<String, usize>,
    /// (function name, index of its first instruction), in order; the first is the kernel.
    pub functions: Vec<(String, usize)>,
    /// Per instruction, the source line nvdisasm printed before it (`-g`/`-gi` on a cubin built
    /// with `-lineinfo`); empty when the cubin has no line info.
    pub lines: Vec<Option<super::srcloc::SrcLoc>>,
}

impl Section {
    /// The source line of instruction `i`, where the listing has line info.
    pub fn source_of(&self, i: usize) -> Option<&super::srcloc::SrcLoc> {
        self.lines.get(i).and_then(|l| l.as_ref())
    }
    /// Index of the function that owns instruction `i`.
    pub fn function_of(&self, i: usize) -> usize {
        let mut f = 0;
        for (k, (_, start)) in self.functions.iter().enumerate() {
            if *start <= i {
                f = k;
            }
        }
        f
    }
    /// Index range of function `f`'s instructions.
    pub fn function_range(&self, f: usize) -> std::ops::Range<usize> {
        let start = self.functions[f].1;
        let end = self
            .functions
            .get(f + 1)
            .map(|x| x.1)
            .unwrap_or(self.insns.len());
        start..end
    }
}

pub fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    let mut in_tick = false;
    for (i, c) in s.char_indices() {
        match c {
            '`' => in_tick = !in_tick,
            '[' | '{' | '(' if !in_tick => depth += 1,
            ']' | '}' | ')' if !in_tick => depth -= 1,
            ',' if depth == 0 && !in_tick => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    let last = s[start..].trim();
    if !last.is_empty() {
        out.push(last);
    }
    out
}

/// Parses one register token with prefixes (`-`, `!`, `~`, `|`) and suffixes (`.64`, `.reuse`,
/// `.H1_H1`, `.B2`, ...).
pub fn parse_reg_op(tok: &str) -> Option<RegOp> {
    let mut t = tok.trim();
    let mut negated = false;
    while let Some(r) = t.strip_prefix(['-', '!', '~', '|', '+']) {
        negated = true;
        t = r;
    }
    // `|R0|.reuse`: the closing bar of an absolute value sits before the suffixes.
    let t = t.replace('|', "");
    let mut parts = t.split('.');
    let base = parts.next()?;
    let reg = parse_reg(base)?;
    let mut width = 1;
    for p in parts {
        match p {
            "64" => width = 2,
            "128" => width = 4,
            _ => {}
        }
    }
    Some(RegOp {
        reg,
        width,
        negated,
    })
}

fn parse_number(s: &str) -> Option<i64> {
    let s = s.trim();
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let v = if let Some(h) = s.strip_prefix("0x") {
        i64::from_str_radix(h, 16).ok()?
    } else {
        s.parse::<i64>().ok()?
    };
    Some(if neg { -v } else { v })
}

/// Registers and the immediate sum of an address group `R2.64+UR4+0x10`.
fn parse_addr_group(g: &str) -> (Vec<RegOp>, i64) {
    let mut regs = Vec::new();
    let mut imm = 0i64;
    for t in g.split('+') {
        let t = t.trim();
        if t.is_empty() {
            continue;
        }
        if let Some(r) = parse_reg_op(t) {
            regs.push(r);
        } else if let Some(v) = parse_number(t) {
            imm += v;
        }
    }
    (regs, imm)
}

/// Splits `desc[UR4][R2.64]` into (`desc`, [`UR4`, `R2.64`]).
fn bracket_groups(s: &str) -> Option<(&str, Vec<&str>)> {
    let open = s.find('[')?;
    let prefix = s[..open].trim();
    let mut groups = Vec::new();
    let mut rest = &s[open..];
    while let Some(r) = rest.strip_prefix('[') {
        let close = r.find(']')?;
        groups.push(&r[..close]);
        rest = r[close + 1..].trim_start();
    }
    Some((prefix, groups))
}

/// Parses one operand.
pub fn parse_operand(tok: &str) -> Operand {
    let t = tok.trim();
    if let Some(inner) = t.strip_prefix('`') {
        let inner = inner.trim_end_matches('`');
        let inner = inner
            .strip_prefix('(')
            .and_then(|x| x.strip_suffix(')'))
            .unwrap_or(inner);
        return Operand::Label(inner.to_string());
    }
    if t.contains('[') {
        if let Some((prefix, groups)) = bracket_groups(t.trim_start_matches(['-', '|', '!'])) {
            if prefix == "c" || prefix == "cx" || prefix == "ucx" {
                let bank_g = groups.first().copied().unwrap_or("");
                let off_g = groups.get(1).copied().unwrap_or("");
                let bank = parse_number(bank_g).map(|b| b as u32);
                let (mut index, offset) = parse_addr_group(off_g);
                if bank.is_none() {
                    let (bregs, _) = parse_addr_group(bank_g);
                    index.extend(bregs);
                }
                return Operand::CBank {
                    bank,
                    offset,
                    index,
                };
            }
            let mut desc = Vec::new();
            let mut addr = Vec::new();
            let mut imm = 0;
            let is_desc = prefix.ends_with("desc");
            for (k, g) in groups.iter().enumerate() {
                let (regs, v) = parse_addr_group(g);
                if is_desc && k == 0 {
                    desc = regs;
                } else {
                    addr.extend(regs);
                    imm += v;
                }
            }
            // A trailing modifier such as `gdesc[UR4].tnspB` is not part of the address.
            return Operand::Mem {
                prefix: prefix.to_string(),
                desc,
                addr,
                imm,
            };
        }
    }
    if let Some(r) = parse_reg_op(t) {
        return Operand::Reg(r);
    }
    let body = t.trim_start_matches(['-', '+']);
    if body.starts_with(|c: char| c.is_ascii_digit())
        || body.starts_with("INF")
        || body.starts_with("QNAN")
        || body.starts_with("NAN")
    {
        return Operand::Imm(t.to_string());
    }
    Operand::Other(t.to_string())
}

/// Splits an operand token at whitespace outside brackets and labels (`R4 -0xc0` → `R4`,
/// `-0xc0`); a trailing space (`+INF `) splits nothing.
fn split_spaces(t: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start, mut tick) = (0i32, 0usize, false);
    for (i, c) in t.char_indices() {
        match c {
            '`' => tick = !tick,
            '[' | '(' | '{' if !tick => depth += 1,
            ']' | ')' | '}' if !tick => depth -= 1,
            c if c.is_whitespace() && depth == 0 && !tick => {
                if !t[start..i].trim().is_empty() {
                    out.push(t[start..i].trim());
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    if !t[start..].trim().is_empty() {
        out.push(t[start..].trim());
    }
    out
}

/// Parses one instruction line such as `/*0070*/  @!P0 BRA `(.L_x_3) ;`. Returns `None` for
/// lines that are not instructions.
pub fn parse_line(line: &str) -> Option<Insn> {
    let l = line.trim();
    let rest = l.strip_prefix("/*")?;
    let end = rest.find("*/")?;
    let offset = u32::from_str_radix(rest[..end].trim(), 16).ok()?;
    let mut body = rest[end + 2..].trim();
    // Strip a trailing `;` and anything after it (encodings in `-hex` mode, comments).
    if let Some(semi) = body.find(';') {
        body = body[..semi].trim();
    }
    // Strip an annotation such as `(*"BRANCH_TARGETS .L_x_23,.L_x_24"*)` (after BRX).
    if let Some(c) = body.find("(*") {
        body = body[..c].trim();
    }
    if body.is_empty() {
        return None;
    }
    let text = body.to_string();
    let mut guard = None;
    if let Some(g) = body.strip_prefix('@') {
        let sp = g.find(char::is_whitespace)?;
        let (gname, after) = g.split_at(sp);
        let (negated, name) = match gname.strip_prefix('!') {
            Some(n) => (true, n),
            None => (false, gname),
        };
        guard = Some(Guard {
            reg: parse_reg(name)?,
            negated,
        });
        body = after.trim();
    }
    let (opcode, ops) = match body.find(char::is_whitespace) {
        Some(sp) => (&body[..sp], body[sp..].trim()),
        None => (body, ""),
    };
    // A register target and its label are separated by a space only: `RET.REL.NODEC R4 `(k)`.
    // Operands separated by a space only: a register target and its label (`RET.REL.NODEC R4
    // `(k)`), a register and its offset (`BRX R4 -0xc0`).
    let operands = split_top(ops)
        .into_iter()
        .flat_map(split_spaces)
        .map(parse_operand)
        .collect();
    Some(Insn {
        offset,
        guard,
        opcode: opcode.to_string(),
        operands,
        text,
    })
}

/// Parses the whole `nvdisasm -c` listing of a cubin into one section per kernel.
pub fn parse_listing(listing: &str) -> Vec<Section> {
    let mut sections: Vec<Section> = Vec::new();
    let mut cur: Option<Section> = None;
    let mut functions_declared: std::collections::HashSet<String> = Default::default();
    let mut pending_labels: Vec<String> = Vec::new();
    let mut loc: Option<super::srcloc::SrcLoc> = None;
    let mut loc_fresh = false;
    for line in listing.lines() {
        let t = line.trim();
        if let Some(l) = super::srcloc::parse(t) {
            // nvdisasm -gi prints an inlined line and then its outermost call site for the
            // same instructions: keep the most detailed of comments in a row.
            let keep_previous = loc_fresh
                && loc
                    .as_ref()
                    .is_some_and(|p| p.inlined_at.len() > l.inlined_at.len());
            if !keep_previous {
                loc = Some(l);
            }
            loc_fresh = true;
            continue;
        }
        // `.section NAME, ...` — not `.sectioninfo` (sm_80 listings print one after each
        // `.section`), which would otherwise end the section before its instructions.
        if let Some(rest) = t
            .strip_prefix(".section")
            .filter(|r| r.starts_with(char::is_whitespace))
        {
            let name = rest.trim().split(',').next().unwrap_or("").trim();
            if let Some(k) = name.strip_prefix(".text.") {
                if let Some(s) = cur.take() {
                    sections.push(s);
                }
                cur = Some(Section {
                    kernel: k.to_string(),
                    ..Default::default()
                });
                pending_labels.clear();
                loc = None;
            } else if let Some(s) = cur.take() {
                sections.push(s);
            }
            continue;
        }
        let Some(sec) = cur.as_mut() else { continue };
        if let Some(rest) = t.strip_prefix(".type") {
            let mut it = rest.split(',');
            let name = it.next().unwrap_or("").trim();
            if it.next().map(|x| x.trim()) == Some("@function") {
                functions_declared.insert(name.to_string());
            }
            continue;
        }
        if t.starts_with("/*") {
            if let Some(insn) = parse_line(t) {
                let idx = sec.insns.len();
                for l in pending_labels.drain(..) {
                    if (functions_declared.contains(&l) || l == sec.kernel)
                        && !sec.functions.iter().any(|(n, _)| *n == l)
                    {
                        sec.functions.push((l.clone(), idx));
                    }
                    sec.labels.insert(l, idx);
                }
                sec.insns.push(insn);
                loc_fresh = false;
                if loc.is_some() || !sec.lines.is_empty() {
                    sec.lines.resize(idx, None);
                    sec.lines.push(loc.clone());
                }
            }
            continue;
        }
        if let Some(label) = t.strip_suffix(':') {
            if !label.contains(char::is_whitespace) && !label.is_empty() {
                pending_labels.push(label.to_string());
            }
        }
    }
    if let Some(s) = cur.take() {
        sections.push(s);
    }
    for s in &mut sections {
        let n = s.insns.len();
        if !s.lines.is_empty() {
            s.lines.resize(n, None);
        }
        for l in pending_labels.drain(..) {
            s.labels.entry(l).or_insert(n);
        }
        if s.functions.first().map(|f| f.1) != Some(0) {
            s.functions.insert(0, (s.kernel.clone(), 0));
        }
        s.functions.sort_by_key(|f| f.1);
    }
    sections
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(reg: Reg, width: usize) -> RegOp {
        RegOp {
            reg,
            width,
            negated: false,
        }
    }

    #[test]
    fn line_info_keeps_the_inlined_line_over_its_call_site() {
        let listing = "\t.section\t.text.k,\"ax\",@progbits\nk:\n\
            //## File \"/k.cu\", line 3\n        /*0000*/ S2R R0, SR_TID.X ;\n\
            //## File \"/k.cu\", line 60 inlined at \"/k.cu\", line 129\n\
            //## File \"/k.cu\", line 129\n        /*0010*/ S2R R1, SR_TID.Y ;\n\
                    /*0020*/ S2R R2, SR_TID.Z ;\n\
            //## File \"/k.cu\", line 129\n        /*0030*/ EXIT ;\n";
        let secs = parse_listing(listing);
        let shown: Vec<String> = (0..4)
            .map(|i| {
                secs[0]
                    .source_of(i)
                    .map(|l| l.to_string())
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(
            shown,
            [
                "/k.cu:3",
                "/k.cu:60 (inlined at /k.cu:129)",
                "/k.cu:60 (inlined at /k.cu:129)",
                "/k.cu:129"
            ]
        );
    }

    #[test]
    fn sectioninfo_does_not_end_a_section() {
        let listing =
            "\t.section\t.text.k,\"ax\",@progbits\n\t.sectioninfo\t@\"SHI_REGISTERS=8\"\n\
                       k:\n        /*0000*/ S2R R0, SR_TID.X ;\n        /*0010*/ EXIT ;\n";
        let secs = parse_listing(listing);
        assert_eq!(secs.len(), 1);
        assert_eq!(secs[0].kernel, "k");
        assert_eq!(secs[0].insns.len(), 2);
    }

    #[test]
    fn parses_guard_opcode_and_label() {
        let i = parse_line("        /*00a0*/              @!P0 BRA `(.L_x_3) ;").unwrap();
        assert_eq!(i.offset, 0xa0);
        assert_eq!(
            i.guard,
            Some(Guard {
                reg: Reg::P(0),
                negated: true
            })
        );
        assert_eq!(i.opcode, "BRA");
        assert_eq!(i.operands, vec![Operand::Label(".L_x_3".into())]);
        assert_eq!(i.text, "@!P0 BRA `(.L_x_3)");
    }

    #[test]
    fn parses_uniform_guard_and_pt() {
        let i = parse_line("/*0010*/ @!UP1 UMOV UR4, 0x1 ;").unwrap();
        assert_eq!(i.guard.unwrap().reg, Reg::UP(1));
        let j = parse_line("/*0010*/ @PT MOV R1, R2 ;").unwrap();
        assert_eq!(j.guard.unwrap().reg, Reg::True);
        assert!(j.real_guard().is_none());
    }

    #[test]
    fn parses_global_load_with_desc() {
        let i =
            parse_line("/*0050*/                   LDG.E.128 R4, desc[UR4][R2.64+0x10] ;").unwrap();
        assert_eq!(i.op(), "LDG");
        assert!(i.has_mod("128"));
        assert_eq!(i.operands[0], Operand::Reg(r(Reg::R(4), 1)));
        assert_eq!(
            i.operands[1],
            Operand::Mem {
                prefix: "desc".into(),
                desc: vec![r(Reg::UR(4), 1)],
                addr: vec![r(Reg::R(2), 2)],
                imm: 0x10
            }
        );
    }

    #[test]
    fn parses_constant_bank() {
        let i = parse_line("/*0020*/ LDC.64 R2, c[0x0][0x218] ;").unwrap();
        assert_eq!(
            i.operands[1],
            Operand::CBank {
                bank: Some(0),
                offset: 0x218,
                index: vec![]
            }
        );
        let j = parse_line("/*0020*/ LDC R2, c[0x3][R4+0x10] ;").unwrap();
        assert_eq!(
            j.operands[1],
            Operand::CBank {
                bank: Some(3),
                offset: 0x10,
                index: vec![r(Reg::R(4), 1)]
            }
        );
    }

    #[test]
    fn parses_shared_and_uniform_addresses() {
        let i = parse_line("/*0100*/ LDS.U.128 R8, [R3+UR4+0x400] ;").unwrap();
        match &i.operands[1] {
            Operand::Mem { addr, imm, .. } => {
                assert_eq!(addr, &vec![r(Reg::R(3), 1), r(Reg::UR(4), 1)]);
                assert_eq!(*imm, 0x400);
            }
            o => panic!("{o:?}"),
        }
        let j = parse_line("/*05c0*/ SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R0 ;").unwrap();
        assert_eq!(j.operands[0], Operand::Reg(r(Reg::P(0), 1)));
        assert!(j.operands[1].is_mem());
    }

    #[test]
    fn parses_hgmma_and_negations() {
        let i =
            parse_line("/*06a0*/ HGMMA.64x64x16.F32 R24, gdesc[UR8], RZ, !UPT, gsb0 ;").unwrap();
        assert_eq!(i.operands.len(), 5);
        match &i.operands[1] {
            Operand::Mem { prefix, desc, .. } => {
                assert_eq!(prefix, "gdesc");
                assert_eq!(desc[0].reg, Reg::UR(8));
            }
            o => panic!("{o:?}"),
        }
        assert_eq!(i.operands[2], Operand::Reg(r(Reg::Zero, 1)));
        assert!(i.operands[3].as_reg().unwrap().negated);
        assert_eq!(i.operands[4], Operand::Other("gsb0".into()));
        let f = parse_line("/*0270*/ FSETP.GTU.FTZ.AND P0, PT, |R0|, +INF , PT ;").unwrap();
        assert_eq!(f.operands[2].as_reg().unwrap().reg, Reg::R(0));
        assert!(matches!(f.operands[3], Operand::Imm(_)));
        let h = parse_line("/*02d0*/ FSETP.NEU.FTZ.AND P2, PT, |R0|.reuse, +INF , PT ;").unwrap();
        assert_eq!(h.operands[2].as_reg().unwrap().reg, Reg::R(0));
        let g = parse_line("/*0950*/ FADD R24, R24, -R2.reuse ;").unwrap();
        assert_eq!(g.operands[2].as_reg().unwrap().reg, Reg::R(2));
    }

    #[test]
    fn parses_branch_with_predicate_operand_and_call() {
        let i = parse_line("/*0300*/ @!P1 BRA !P2, `(.L_x_16) ;").unwrap();
        assert_eq!(i.operands.len(), 2);
        assert_eq!(i.operands[0].as_reg().unwrap().reg, Reg::P(2));
        assert_eq!(i.label_target(), Some(".L_x_16"));
        let b =
            parse_line("/*00b0*/ BRX R4 -0xc0    (*\"BRANCH_TARGETS .L_x_23,.L_x_24\"*);").unwrap();
        assert_eq!(b.operands.len(), 2);
        assert_eq!(b.operands[0].as_reg().unwrap().reg, Reg::R(4));
        assert_eq!(b.operands[1], Operand::Imm("-0xc0".into()));
        let r = parse_line("/*0160*/ RET.REL.NODEC R20 `(leak_indirect_call) ;").unwrap();
        assert_eq!(r.operands.len(), 2);
        assert_eq!(r.operands[0].as_reg().unwrap().reg, Reg::R(20));
        assert_eq!(r.label_target(), Some("leak_indirect_call"));
        let c =
            parse_line("/*00c0*/ CALL.REL.NOINC `($__internal_0_$__cuda_sm20_div_s64) ;").unwrap();
        assert_eq!(c.label_target(), Some("$__internal_0_$__cuda_sm20_div_s64"));
    }

    #[test]
    fn special_registers_and_tma() {
        let i = parse_line("/*0010*/ S2R R5, SR_TID.X ;").unwrap();
        assert_eq!(i.operands[1], Operand::Other("SR_TID.X".into()));
        let t = parse_line("/*1390*/ UTMALDG.2D [UR12], [UR6] ;").unwrap();
        assert_eq!(t.op(), "UTMALDG");
        assert_eq!(t.operands.len(), 2);
        assert!(parse_line("        .weak foo").is_none());
    }

    #[test]
    fn listing_sections_functions_labels() {
        let listing = r#"
	.section	.text.k,"ax",@progbits
        .type           k,@function
k:
.text.k:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 BRA `(.L_x_3) ;
        /*0020*/                   CALL.REL.NOINC `($__internal_0_$__cuda_sm20_div_s64) ;
.L_x_3:
        /*0030*/                   EXIT ;
        .type           $__internal_0_$__cuda_sm20_div_s64,@function
$__internal_0_$__cuda_sm20_div_s64:
        /*0040*/                   RET.REL.NODEC R4 `(k) ;
"#;
        let s = parse_listing(listing);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].kernel, "k");
        assert_eq!(s[0].insns.len(), 5);
        assert_eq!(s[0].labels[".L_x_3"], 3);
        assert_eq!(s[0].functions.len(), 2);
        assert_eq!(s[0].functions[1].1, 4);
        assert_eq!(s[0].function_of(4), 1);
    }
}
