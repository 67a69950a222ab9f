//! [`StateDict`]: named tensors plus string metadata, the saved form of
//! optimizers, schedules and loss scalers, stored as one safetensors file.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use tessera_tensor::{safetensors, Error, Result, Tensor};

/// What an optimizer, a schedule or a loss scaler saves: state tensors by
/// name and hyperparameters/counters as strings (the safetensors
/// `__metadata__` map). Several state dicts combine into one checkpoint
/// with [`StateDict::merge_prefixed`] and come apart with
/// [`StateDict::prefixed`].
#[derive(Debug, Clone, Default)]
pub struct StateDict {
    /// State tensors by name.
    pub tensors: BTreeMap<String, Tensor>,
    /// Hyperparameters and counters by name.
    pub metadata: BTreeMap<String, String>,
}

impl StateDict {
    /// An empty state dict.
    pub fn new() -> StateDict {
        StateDict::default()
    }

    /// Writes the state dict to a safetensors file at `path` (atomically).
    /// Errors on I/O failure or a tensor not on the CPU.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let meta: HashMap<String, String> = self.metadata.clone().into_iter().collect();
        safetensors::save_with_metadata(path, self.tensors.iter(), &meta)
    }

    /// Reads a state dict written by [`StateDict::save`]. Errors when the
    /// file cannot be read or is corrupt.
    pub fn load(path: impl AsRef<Path>) -> Result<StateDict> {
        let (tensors, metadata) = safetensors::load_with_metadata(path)?;
        Ok(StateDict {
            tensors: tensors.into_iter().collect(),
            metadata: metadata.into_iter().collect(),
        })
    }

    /// Records `value` under `key`, written so that it parses back exactly.
    pub fn set(&mut self, key: impl Into<String>, value: impl std::fmt::Debug) {
        self.metadata.insert(key.into(), format!("{value:?}"));
    }

    /// The metadata string under `key`. Errors, naming `op`, when missing.
    pub fn get_str(&self, op: &'static str, key: &str) -> Result<&str> {
        self.metadata
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| Error::arg(op, format!("the state dict has no entry {key:?}")))
    }

    /// The metadata under `key` parsed as `T`. Errors, naming `op`, when it
    /// is missing or does not parse.
    pub fn get<T: std::str::FromStr>(&self, op: &'static str, key: &str) -> Result<T> {
        let s = self.get_str(op, key)?;
        s.parse()
            .map_err(|_| Error::arg(op, format!("entry {key:?} = {s:?} does not parse")))
    }

    /// The tensor under `key`. Errors, naming `op`, when missing.
    pub fn tensor(&self, op: &'static str, key: &str) -> Result<&Tensor> {
        self.tensors
            .get(key)
            .ok_or_else(|| Error::arg(op, format!("the state dict has no tensor {key:?}")))
    }

    /// Adds every entry of `other` under `prefix` followed by a dot.
    pub fn merge_prefixed(&mut self, prefix: &str, other: StateDict) {
        for (k, t) in other.tensors {
            self.tensors.insert(format!("{prefix}.{k}"), t);
        }
        for (k, v) in other.metadata {
            self.metadata.insert(format!("{prefix}.{k}"), v);
        }
    }

    /// The entries under `prefix` followed by a dot, with that prefix removed.
    pub fn prefixed(&self, prefix: &str) -> StateDict {
        let p = format!("{prefix}.");
        StateDict {
            tensors: self
                .tensors
                .iter()
                .filter_map(|(k, t)| k.strip_prefix(&p).map(|k| (k.to_string(), t.clone())))
                .collect(),
            metadata: self
                .metadata
                .iter()
                .filter_map(|(k, v)| k.strip_prefix(&p).map(|k| (k.to_string(), v.clone())))
                .collect(),
        }
    }
}

/// Errors, naming `op`, unless `sd` was saved by the kind `expected`.
pub(crate) fn check_kind(op: &'static str, sd: &StateDict, expected: &str) -> Result<()> {
    let kind = sd.get_str(op, "kind")?;
    if kind != expected {
        return Err(Error::arg(
            op,
            format!("the state dict was saved by {kind}, not by {expected}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_a_file_with_prefixes() {
        let mut inner = StateDict::new();
        inner.set("lr", 0.1f64 + 0.2);
        inner.set("flag", true);
        inner
            .tensors
            .insert("m".into(), Tensor::from_vec(vec![1.0f32, -2.5], &[2]).unwrap());
        let mut sd = StateDict::new();
        sd.merge_prefixed("optim", inner);
        sd.set("epoch", 7u64);
        let path = std::env::temp_dir().join(format!("tessera-optim-sd-{}.safetensors", std::process::id()));
        sd.save(&path).unwrap();
        let back = StateDict::load(&path).unwrap();
        std::fs::remove_file(&path).ok();
        let inner = back.prefixed("optim");
        assert_eq!(
            inner.get::<f64>("t", "lr").unwrap(),
            0.1 + 0.2,
            "f64 survives exactly"
        );
        assert!(inner.get::<bool>("t", "flag").unwrap());
        assert_eq!(back.get::<u64>("t", "epoch").unwrap(), 7);
        assert_eq!(
            inner.tensor("t", "m").unwrap().to_vec::<f32>().unwrap(),
            vec![1.0, -2.5]
        );
        assert!(inner.get::<f64>("t", "missing").is_err());
        assert!(back.get::<u64>("t", "optim.lr").is_err());
    }
}
