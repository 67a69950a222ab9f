//! Loading and saving a module's state dict, by PyTorch name, through
//! safetensors.

use std::path::Path;

use tessera_tensor::{safetensors, Error, Result, StateDict, Tensor};

use crate::{walk, Entry, Module};

/// What [`load_state_dict`] found: keys the module has but the state dict
/// lacks, keys the state dict has but the module lacks, and keys whose
/// shapes differ (`(name, expected, found)`), each sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Module keys absent from the state dict (left unchanged).
    pub missing: Vec<String>,
    /// State-dict keys the module does not have (ignored).
    pub unexpected: Vec<String>,
    /// Keys present in both with different shapes: `(name, module shape,
    /// state-dict shape)` (left unchanged).
    pub mismatched: Vec<(String, Vec<usize>, Vec<usize>)>,
}

impl LoadReport {
    /// True when every key matched (PyTorch's `strict=True` success).
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.mismatched.is_empty()
    }
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if !self.missing.is_empty() {
            parts.push(format!("missing keys: {}", self.missing.join(", ")));
        }
        if !self.unexpected.is_empty() {
            parts.push(format!("unexpected keys: {}", self.unexpected.join(", ")));
        }
        for (k, want, got) in &self.mismatched {
            parts.push(format!(
                "size mismatch for {k}: the module has shape {want:?}, the state dict {got:?}"
            ));
        }
        if parts.is_empty() {
            write!(f, "all keys matched")
        } else {
            write!(f, "{}", parts.join("; "))
        }
    }
}

/// Copies the tensors of `sd` into `module`'s parameters and buffers by
/// name (values are cast to each parameter's dtype, as PyTorch's `copy_`
/// does) and returns what did not match.
///
/// With `strict`, any missing, unexpected or wrongly shaped key is an
/// error naming them all, and nothing is changed. Without it, matching keys
/// are loaded, the rest are reported, and only a wrong shape is skipped
/// (PyTorch errors on it even when not strict; tessera reports it in
/// [`LoadReport::mismatched`] so partial loads such as a new classifier head
/// work).
pub fn load_state_dict<M: Module + ?Sized>(module: &M, sd: &StateDict, strict: bool) -> Result<LoadReport> {
    let mut report = LoadReport::default();
    let mut seen = std::collections::HashSet::new();
    let mut apply: Vec<Box<dyn FnOnce() -> Result<()> + '_>> = Vec::new();
    walk(module, &mut |key, e| {
        let (shape, target) = match e {
            Entry::Parameter(p) => (p.shape(), Target::Param(p)),
            Entry::Buffer(b) if b.is_persistent() => (b.shape(), Target::Buffer(b)),
            _ => return,
        };
        seen.insert(key.to_string());
        match sd.tensor(key) {
            None => report.missing.push(key.to_string()),
            Some(t) if t.shape() != shape.as_slice() => {
                report
                    .mismatched
                    .push((key.to_string(), shape, t.shape().to_vec()))
            }
            Some(t) => {
                let t = t.clone();
                apply.push(Box::new(move || target.assign(&t)));
            }
        }
    });
    report.unexpected = sd
        .keys()
        .filter(|k| !seen.contains(*k))
        .map(String::from)
        .collect();
    report.missing.sort();
    report.unexpected.sort();
    report.mismatched.sort();
    if strict && !report.is_clean() {
        return Err(Error::arg(
            "load_state_dict",
            format!(
                "error(s) loading the state dict into {}: {report}",
                module.type_name()
            ),
        ));
    }
    for f in apply {
        f()?;
    }
    Ok(report)
}

/// Writes `module`'s state dict to a safetensors file at `path`, one tensor
/// per key (PyTorch's `safetensors.torch.save_file(model.state_dict())`
/// form; a parameter shared under two names is written under both).
/// Errors on I/O failure or a tensor not on the CPU.
pub fn save<M: Module + ?Sized>(module: &M, path: impl AsRef<Path>) -> Result<()> {
    safetensors::save(path, module.state_dict().iter())
}

/// Reads a safetensors file and loads it into `module` with
/// [`load_state_dict`]. Errors when the file cannot be read or is corrupt,
/// or as [`load_state_dict`].
pub fn load<M: Module + ?Sized>(module: &M, path: impl AsRef<Path>, strict: bool) -> Result<LoadReport> {
    load_state_dict(module, &StateDict::load(path)?, strict)
}

/// Where a loaded tensor goes.
enum Target<'a> {
    Param(&'a tessera_autograd::Parameter),
    Buffer(&'a crate::Buffer),
}

impl Target<'_> {
    fn assign(&self, t: &Tensor) -> Result<()> {
        match self {
            Target::Param(p) => p.set(t.to_dtype(p.dtype())?.contiguous()?),
            Target::Buffer(b) => {
                let dtype = b.tensor().dtype();
                b.set(t.to_dtype(dtype)?.contiguous()?)
            }
        }
    }
}
