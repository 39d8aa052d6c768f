//! Which kernels of a cubin to audit (`--kernel`), which of their parameters are secret
//! (`--secret-param`, by ordinal or by name) and which point at public buffers
//! (`--public-param`). Every request that cannot be met exactly — a
//! kernel that is not there, a name no kernel has, a name in a kernel whose signature cannot be
//! read — is an error that says what to give instead; nothing is dropped silently.

use super::cubin::KernelInfo;
use super::public::{field_range, PublicSpec};
use super::sass::Section;
pub use super::signature::ParamSpec;
use super::signature::{base_name, param_ordinal, Signature};
use crate::error::{Error, Result};

/// What to audit, what is secret beyond global memory, and which pointers point at public
/// buffers.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only the kernel with this symbol or plain name (`--kernel`).
    pub kernel: Option<String>,
    /// Secret parameters of every audited kernel.
    pub secret: Vec<ParamSpec>,
    /// Pointers to public buffers (`--public-param`) of every audited kernel.
    pub public: Vec<PublicSpec>,
    /// `__global__` signatures that give parameter names (from the source file).
    pub signatures: Option<Vec<Signature>>,
}

/// One kernel [`Selection::pick`] chose, with what is declared about its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picked {
    /// Index into the kernels given to `pick`.
    pub index: usize,
    /// Secret parameter ordinals, sorted.
    pub secret: Vec<usize>,
    /// Constant-bank-0 byte ranges of the pointers to public buffers.
    pub public: Vec<(u32, u32)>,
}

/// Whether a cubin built for `have` is the one `--arch want` asks for. A cubin's ELF header
/// does not always tell `sm_90` from `sm_90a`, so a bare `have` matches either.
pub fn arch_matches(want: &str, have: &str) -> bool {
    want == have || want.trim_end_matches(['a', 'f']) == have
}

fn display_name(symbol: &str) -> String {
    let b = base_name(symbol);
    if b == symbol {
        symbol.to_string()
    } else {
        format!("{symbol} ({b})")
    }
}

impl Selection {
    /// The ordinal `spec` names in kernel `k` (`None`: a name this kernel does not have, which
    /// is fine as long as some audited kernel has it). `flag` is the option, for messages.
    fn ordinal(
        &self,
        flag: &str,
        spec: &ParamSpec,
        sec: &Section,
        info: Option<&KernelInfo>,
    ) -> Result<Option<usize>> {
        match spec {
            ParamSpec::Ordinal(n) => Ok(Some(*n)),
            ParamSpec::Name(name) => {
                let count = info.map(|i| i.params.len()).unwrap_or(0);
                let Some(sigs) = &self.signatures else {
                    return Err(Error::Other(format!(
                        "{flag} {name}: a cubin does not record parameter names; give the parameter's 0-based ordinal instead (kernel `{}` has {count} parameter(s)), or the source with --signatures FILE.cu",
                        sec.kernel
                    )));
                };
                param_ordinal(sigs, &sec.kernel, count, name)
                    .map_err(|e| Error::Other(format!("{flag} {name}: {e}")))
            }
        }
    }

    /// The kernels to audit, each with its secret parameter ordinals and public-buffer pointers.
    pub fn pick(&self, kernels: &[(Section, Option<KernelInfo>)]) -> Result<Vec<Picked>> {
        let chosen: Vec<usize> = match &self.kernel {
            None => (0..kernels.len()).collect(),
            Some(want) => {
                let v: Vec<usize> = (0..kernels.len())
                    .filter(|&k| {
                        let s = &kernels[k].0.kernel;
                        s == want || base_name(s) == want
                    })
                    .collect();
                if v.is_empty() {
                    let have: Vec<String> = kernels
                        .iter()
                        .map(|(s, _)| display_name(&s.kernel))
                        .collect();
                    return Err(Error::Other(format!(
                        "--kernel {want}: no such kernel; this file has {}",
                        if have.is_empty() {
                            "none".to_string()
                        } else {
                            have.join(", ")
                        }
                    )));
                }
                v
            }
        };
        let mut found = vec![false; self.secret.len()];
        let mut found_public = vec![false; self.public.len()];
        let mut out = Vec::new();
        for k in chosen {
            let (sec, info) = &kernels[k];
            let mut ordinals = Vec::new();
            for (j, spec) in self.secret.iter().enumerate() {
                if let Some(n) = self.ordinal("--secret-param", spec, sec, info.as_ref())? {
                    ordinals.push(n);
                    found[j] = true;
                }
            }
            ordinals.sort_unstable();
            ordinals.dedup();
            let mut public = Vec::new();
            for (j, spec) in self.public.iter().enumerate() {
                if let Some(n) = self.ordinal("--public-param", &spec.param, sec, info.as_ref())? {
                    if ordinals.contains(&n) {
                        return Err(Error::Other(format!(
                            "--public-param {spec}: parameter #{n} of `{}` is also given with --secret-param; a parameter is secret or points at a public buffer, not both",
                            sec.kernel
                        )));
                    }
                    public.push(field_range(&sec.kernel, info.as_ref(), spec, n)?);
                    found_public[j] = true;
                }
            }
            out.push(Picked {
                index: k,
                secret: ordinals,
                public,
            });
        }
        let missing = found
            .iter()
            .position(|f| !f)
            .map(|j| format!("--secret-param {}", self.secret[j]))
            .or_else(|| {
                found_public
                    .iter()
                    .position(|f| !f)
                    .map(|j| format!("--public-param {}", self.public[j]))
            });
        if let Some(flag) = missing {
            let have: Vec<String> = self
                .signatures
                .iter()
                .flatten()
                .map(|s| {
                    let p: Vec<&str> = s
                        .params
                        .iter()
                        .map(|p| p.as_deref().unwrap_or("_"))
                        .collect();
                    format!("{}({})", s.name, p.join(", "))
                })
                .collect();
            return Err(Error::Other(format!(
                "{flag}: no audited kernel has a parameter of that name (the source declares {})",
                if have.is_empty() {
                    "no __global__ function".into()
                } else {
                    have.join(", ")
                }
            )));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn param_specs() {
        assert_eq!("2".parse::<ParamSpec>(), Ok(ParamSpec::Ordinal(2)));
        assert_eq!("q".parse::<ParamSpec>(), Ok(ParamSpec::Name("q".into())));
        assert!("-1".parse::<ParamSpec>().is_err());
        assert!("a b".parse::<ParamSpec>().is_err());
        assert!("".parse::<ParamSpec>().is_err());
        assert!("99999999999999999999999".parse::<ParamSpec>().is_err());
    }

    #[test]
    fn arch_matching() {
        assert!(arch_matches("sm_90a", "sm_90a"));
        assert!(arch_matches("sm_90a", "sm_90"));
        assert!(!arch_matches("sm_80", "sm_90a"));
        assert!(!arch_matches("sm_90", "sm_90a"));
    }

    fn kernels(names: &[&str], params: usize) -> Vec<(Section, Option<KernelInfo>)> {
        names
            .iter()
            .map(|n| {
                let info = KernelInfo {
                    name: n.to_string(),
                    params: (0..params)
                        .map(|i| super::super::cubin::Param {
                            ordinal: i,
                            offset: 8 * i as u32,
                            size: 8,
                        })
                        .collect(),
                    ..Default::default()
                };
                (
                    Section {
                        kernel: n.to_string(),
                        ..Default::default()
                    },
                    Some(info),
                )
            })
            .collect()
    }

    fn picked(sel: &Selection, ks: &[(Section, Option<KernelInfo>)]) -> Vec<(usize, Vec<usize>)> {
        sel.pick(ks)
            .unwrap()
            .into_iter()
            .map(|p| (p.index, p.secret))
            .collect()
    }

    #[test]
    fn picks_kernels_and_resolves_names() {
        let ks = kernels(&["a", "_Z1bPfS_i"], 3);
        let sigs = super::super::signature::parse_signatures(
            "__global__ void a(float* q, float* o, int n) {}\n__global__ void b(float* o, float* q, int m) {}",
        );
        let sel = Selection {
            kernel: Some("b".into()),
            secret: vec![ParamSpec::Name("q".into())],
            signatures: Some(sigs.clone()),
            ..Default::default()
        };
        assert_eq!(picked(&sel, &ks), vec![(1, vec![1])]);
        let all = Selection {
            secret: vec![ParamSpec::Name("n".into()), ParamSpec::Ordinal(0)],
            signatures: Some(sigs.clone()),
            ..Default::default()
        };
        assert_eq!(picked(&all, &ks), vec![(0, vec![0, 2]), (1, vec![0])]);
        let none = Selection {
            secret: vec![ParamSpec::Name("zz".into())],
            signatures: Some(sigs),
            ..Default::default()
        };
        let e = none.pick(&ks).unwrap_err().to_string();
        assert!(e.contains("zz") && e.contains("a(q, o, n)"), "{e}");
        let missing = Selection {
            kernel: Some("c".into()),
            ..Default::default()
        };
        let e = missing.pick(&ks).unwrap_err().to_string();
        assert!(
            e.contains("no such kernel") && e.contains("_Z1bPfS_i (b)"),
            "{e}"
        );
        let unnamed = Selection {
            secret: vec![ParamSpec::Name("q".into())],
            ..Default::default()
        };
        let e = unnamed.pick(&ks).unwrap_err().to_string();
        assert!(e.contains("ordinal"), "{e}");
    }

    #[test]
    fn public_params_resolve_to_pointer_bytes() {
        let ks = kernels(&["a", "_Z1bPfS_i"], 3);
        let sigs = super::super::signature::parse_signatures(
            "__global__ void a(float* q, float* o, int n) {}\n__global__ void b(float* o, float* q, int m) {}",
        );
        let spec = |s: &str| s.parse::<PublicSpec>().unwrap();
        let sel = Selection {
            kernel: Some("a".into()),
            public: vec![spec("q"), spec("2")],
            secret: vec![ParamSpec::Ordinal(1)],
            signatures: Some(sigs.clone()),
        };
        // Parameters are 8 bytes at 8 * ordinal (no parameter base in this layout).
        let got = sel.pick(&ks).unwrap();
        assert_eq!(got[0].public, vec![(0, 8), (16, 24)]);
        assert_eq!(got[0].secret, vec![1]);
        // In kernel b, `q` is parameter #1, which is secret.
        let e = Selection {
            kernel: Some("b".into()),
            ..sel.clone()
        }
        .pick(&ks)
        .unwrap_err()
        .to_string();
        assert!(e.contains("also given with --secret-param"), "{e}");
        let e = Selection {
            public: vec![spec("zz")],
            signatures: Some(sigs),
            ..Default::default()
        }
        .pick(&ks)
        .unwrap_err()
        .to_string();
        assert!(e.contains("--public-param zz: no audited kernel"), "{e}");
        let e = Selection {
            public: vec![spec("q")],
            ..Default::default()
        }
        .pick(&ks)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--public-param q") && e.contains("ordinal"),
            "{e}"
        );
    }
}
