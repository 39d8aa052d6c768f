//! Facts about the run that go into every record: clocks and driver from `nvidia-smi`, the git
//! commit, the date. Each is `None` when it cannot be found; nothing here fails the run.

use super::record::Clocks;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// One line of `nvidia-smi --query-gpu=clocks.sm,clocks.mem,driver_version --format=csv,noheader`.
#[derive(Debug, Clone, PartialEq)]
pub struct SmiReading {
    pub clocks: Clocks,
    pub driver_version: Option<String>,
}

/// Parses one CSV line such as `1980 MHz, 2619 MHz, 580.95.05` (units optional; `[N/A]` → None).
pub fn parse_smi_line(line: &str) -> Option<SmiReading> {
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    if fields.len() < 3 {
        return None;
    }
    let mhz = |s: &str| -> Option<f64> {
        let num = s.trim_end_matches("MHz").trim();
        num.parse::<f64>().ok().filter(|x| x.is_finite())
    };
    let driver = fields[2];
    Some(SmiReading {
        clocks: Clocks {
            sm_mhz: mhz(fields[0]),
            mem_mhz: mhz(fields[1]),
        },
        driver_version: if driver.is_empty() || driver.starts_with('[') {
            None
        } else {
            Some(driver.to_string())
        },
    })
}

/// Queries `nvidia-smi` for GPU `ordinal`; `None` when it is absent or says something else.
pub fn query_smi(ordinal: usize) -> Option<SmiReading> {
    let out = Command::new("nvidia-smi")
        .args([
            "--query-gpu=clocks.sm,clocks.mem,driver_version",
            "--format=csv,noheader",
            &format!("--id={ordinal}"),
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().find_map(parse_smi_line)
}

/// The commit this binary was built from (build.rs: `git rev-parse HEAD` at build time), if the
/// source was a git checkout.
pub fn build_commit() -> Option<&'static str> {
    Some(env!("FLASHCORE_BUILD_COMMIT")).filter(|c| is_commit(c))
}

/// The commit a record names, and a warning when the environment disagrees. The build's own
/// commit is the truth; `$FLASHCORE_GIT_COMMIT` only fills in for a build that does not know its
/// commit (e.g. built from a tarball) and never silently overrides it. The current directory's
/// repository is never consulted: a run from another checkout would name the wrong build.
pub fn resolve_commit(build: Option<&str>, env: Option<&str>) -> (Option<String>, Option<String>) {
    let env = env.map(str::trim).filter(|c| is_commit(c));
    match (build, env) {
        (Some(b), Some(e)) if !b.starts_with(e) && !e.starts_with(b) => (
            Some(b.to_string()),
            Some(format!(
                "FLASHCORE_GIT_COMMIT={e} differs from this binary's build commit {b}; records name the build commit"
            )),
        ),
        (Some(b), _) => (Some(b.to_string()), None),
        (None, e) => (e.map(str::to_string), None),
    }
}

/// The commit for records ([`resolve_commit`] of the build and `$FLASHCORE_GIT_COMMIT`), printing
/// its warning, if any, to stderr.
pub fn git_commit() -> Option<String> {
    let env = std::env::var("FLASHCORE_GIT_COMMIT").ok();
    let (commit, warning) = resolve_commit(build_commit(), env.as_deref());
    if let Some(w) = warning {
        eprintln!("flashcore: warning: {w}");
    }
    commit
}

/// A commit id: 7 to 64 hex digits (`git rev-parse HEAD` prints `HEAD` when it cannot resolve it).
pub fn is_commit(s: &str) -> bool {
    (7..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `secs` since the Unix epoch as UTC ISO-8601, `YYYY-MM-DDTHH:MM:SSZ`.
pub fn iso8601_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian; Howard Hinnant's method).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Now, UTC ISO-8601.
pub fn now_utc() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    iso8601_utc(secs)
}
