//! [`StateDict`]: the saved form of every stateful object — modules,
//! optimizers, LR schedules, loss scalers — as ordered named tensors plus
//! typed metadata.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::{safetensors, Error, Result, Tensor};

/// Named tensors in insertion order (PyTorch's `state_dict()` order) plus
/// metadata: hyperparameters, counters and settings as typed JSON values.
///
/// Modules, optimizers, LR schedules and loss scalers all save to and load
/// from this one type, so a checkpoint is their state dicts side by side
/// under prefixes ([`StateDict::merge_prefixed`], [`StateDict::prefixed`]).
///
/// ```
/// use tessera_tensor::{StateDict, Tensor};
/// let mut sd = StateDict::new();
/// sd.insert("w", Tensor::from_vec(vec![1.0f32, 2.0], &[2])?);
/// sd.set("lr", 0.1);
/// sd.set("betas", serde_json::json!([0.9, 0.999]));
/// assert_eq!(sd.get::<f64>("load", "lr")?, 0.1);
/// assert_eq!(sd.get::<(f64, f64)>("load", "betas")?, (0.9, 0.999));
/// assert!(sd.get::<u64>("load", "lr").is_err()); // 0.1 is not a u64
/// # Ok::<(), tessera_tensor::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct StateDict {
    tensors: Vec<(String, Tensor)>,
    index: HashMap<String, usize>,
    metadata: BTreeMap<String, Value>,
}

/// The safetensors metadata key holding the JSON object of the metadata.
const META_KEY: &str = "tessera.metadata";
/// The safetensors metadata key holding the JSON array of tensor names in
/// order (the safetensors header itself is unordered).
const ORDER_KEY: &str = "tessera.order";

impl StateDict {
    /// An empty state dict.
    pub fn new() -> StateDict {
        StateDict::default()
    }

    /// Adds `tensor` under `name` at the end, or replaces the tensor already
    /// there in its place; returns the replaced tensor.
    pub fn insert(&mut self, name: impl Into<String>, tensor: Tensor) -> Option<Tensor> {
        let name = name.into();
        match self.index.get(&name) {
            Some(&i) => Some(std::mem::replace(&mut self.tensors[i].1, tensor)),
            None => {
                self.index.insert(name.clone(), self.tensors.len());
                self.tensors.push((name, tensor));
                None
            }
        }
    }

    /// A copy with every tensor on `device` (names, order and metadata
    /// kept), e.g. a GPU model's state moved to the CPU to be saved.
    /// Errors, naming the tensor, when a copy fails.
    pub fn to_device(&self, device: crate::Device) -> Result<StateDict> {
        let mut out = self.clone();
        for (name, t) in &mut out.tensors {
            *t = t
                .to_device(device)
                .map_err(|e| Error::device("StateDict::to_device", format!("{name}: {e}")))?;
        }
        Ok(out)
    }

    /// The tensor under `name`, if any.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.index.get(name).map(|&i| &self.tensors[i].1)
    }

    /// The tensor under `name`. Errors, naming `op` and the key, when it is
    /// missing.
    pub fn require(&self, op: &'static str, name: &str) -> Result<&Tensor> {
        self.tensor(name)
            .ok_or_else(|| Error::arg(op, format!("the state dict has no tensor {name:?}")))
    }

    /// The tensor under `name`, checked to have `shape`. Errors, naming `op`,
    /// the key and both shapes, when it is missing or shaped differently.
    pub fn require_shape(&self, op: &'static str, name: &str, shape: &[usize]) -> Result<&Tensor> {
        let t = self.require(op, name)?;
        if t.shape() != shape {
            return Err(Error::shape(
                op,
                format!(
                    "tensor {name:?} has shape {:?} in the state dict, expected {shape:?}",
                    t.shape()
                ),
            ));
        }
        Ok(t)
    }

    /// True when a tensor is stored under `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The tensors with their names, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.tensors.iter().map(|(k, t)| (k.as_str(), t))
    }

    /// The tensor names, in insertion order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|(k, _)| k.as_str())
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when there are no tensors (metadata may still be present).
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Records `value` under the metadata key `key`, replacing what was
    /// there. A non-finite float is stored as JSON `null` (JSON has no NaN),
    /// so reading it back as a number is an error rather than a wrong value.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        self.metadata.insert(key.into(), value.into());
    }

    /// Records any serialisable `value` (a struct of settings, a tuple)
    /// under `key`. Errors, naming `op` and the key, when serde cannot
    /// represent it as JSON (a map with non-string keys).
    pub fn set_serde<T: Serialize + ?Sized>(
        &mut self,
        op: &'static str,
        key: impl Into<String>,
        value: &T,
    ) -> Result<()> {
        let key = key.into();
        let v = serde_json::to_value(value)
            .map_err(|e| Error::arg(op, format!("metadata {key:?} cannot be stored as JSON: {e}")))?;
        self.metadata.insert(key, v);
        Ok(())
    }

    /// The metadata under `key` as `T`. Errors, naming `op`, the key and the
    /// stored value, when it is missing or does not have `T`'s type.
    pub fn get<T: DeserializeOwned>(&self, op: &'static str, key: &str) -> Result<T> {
        let v = self.meta(op, key)?;
        T::deserialize(v).map_err(|e| {
            Error::arg(
                op,
                format!(
                    "state-dict entry {key:?} = {v} does not have the type {}: {e}",
                    std::any::type_name::<T>()
                ),
            )
        })
    }

    /// The raw JSON metadata under `key`. Errors, naming `op` and the key,
    /// when it is missing.
    pub fn meta(&self, op: &'static str, key: &str) -> Result<&Value> {
        self.metadata
            .get(key)
            .ok_or_else(|| Error::arg(op, format!("the state dict has no entry {key:?}")))
    }

    /// Removes the metadata under `key`, returning it.
    pub fn remove_meta(&mut self, key: &str) -> Option<Value> {
        self.metadata.remove(key)
    }

    /// Every metadata entry, sorted by key.
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }

    /// Adds every tensor and metadata entry of `other` under `prefix` and a
    /// dot (`"optimizer"` turns `state.0.exp_avg` into
    /// `optimizer.state.0.exp_avg`), keeping `other`'s order.
    pub fn merge_prefixed(&mut self, prefix: &str, other: StateDict) {
        for (k, t) in other.tensors {
            self.insert(format!("{prefix}.{k}"), t);
        }
        for (k, v) in other.metadata {
            self.metadata.insert(format!("{prefix}.{k}"), v);
        }
    }

    /// The entries under `prefix` and a dot, with that prefix removed, in
    /// order: the inverse of [`StateDict::merge_prefixed`].
    pub fn prefixed(&self, prefix: &str) -> StateDict {
        let p = format!("{prefix}.");
        let mut out = StateDict::new();
        for (k, t) in &self.tensors {
            if let Some(k) = k.strip_prefix(&p) {
                out.insert(k, t.clone());
            }
        }
        out.metadata = self
            .metadata
            .iter()
            .filter_map(|(k, v)| k.strip_prefix(&p).map(|k| (k.to_string(), v.clone())))
            .collect();
        out
    }

    /// Errors, naming `op`, unless the metadata entry `"kind"` is `expected`
    /// (an optimizer refuses a scheduler's state dict, Adam refuses SGD's).
    pub fn check_kind(&self, op: &'static str, expected: &str) -> Result<()> {
        let kind: String = self.get(op, "kind")?;
        if kind != expected {
            return Err(Error::arg(
                op,
                format!("the state dict was saved by {kind}, not by {expected}"),
            ));
        }
        Ok(())
    }

    /// Writes the state dict to a safetensors file at `path`, atomically and
    /// durably (a temporary file in the same directory, synced, then renamed
    /// over `path`). The tensors are readable by PyTorch's
    /// `safetensors.torch.load_file`; the metadata and order are stored as
    /// JSON in the file's `__metadata__`. Errors, naming the file, on I/O
    /// failure or a tensor not on the CPU.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self
            .to_safetensors(HashMap::new())
            .map_err(|msg| Error::io(safetensors::SAVE, format!("{}: {msg}", path.display())))?;
        crate::durable::write(safetensors::SAVE, path, &bytes)
    }

    /// Reads a state dict written by [`StateDict::save`], or any safetensors
    /// file (then without metadata, tensors sorted by name). Errors, naming
    /// the file, when it cannot be read or is corrupt.
    pub fn load(path: impl AsRef<Path>) -> Result<StateDict> {
        let path = path.as_ref();
        let (tensors, meta) = safetensors::load_with_metadata(path)?;
        StateDict::from_safetensors(tensors, &meta)
            .map_err(|msg| Error::io(safetensors::LOAD, format!("{}: {msg}", path.display())))
    }

    /// The safetensors bytes of this state dict with `extra` entries in the
    /// file's metadata map besides the state dict's own. Errors with a
    /// message (the caller adds the file) as [`safetensors::serialize`].
    pub(crate) fn to_safetensors(
        &self,
        mut extra: HashMap<String, String>,
    ) -> std::result::Result<Vec<u8>, String> {
        let order: Vec<&str> = self.keys().collect();
        extra.insert("format".into(), "pt".into());
        extra.insert(ORDER_KEY.into(), Value::from(order).to_string());
        let meta = serde_json::Map::from_iter(self.metadata.clone());
        extra.insert(META_KEY.into(), Value::Object(meta).to_string());
        safetensors::serialize(self.iter(), extra)
    }

    /// A state dict from a loaded safetensors file's tensors and metadata
    /// map. Errors with a message (the caller adds the file) when the
    /// tessera entries are not valid JSON or do not list the tensors.
    pub(crate) fn from_safetensors(
        mut tensors: HashMap<String, Tensor>,
        meta: &HashMap<String, String>,
    ) -> std::result::Result<StateDict, String> {
        let mut sd = StateDict::new();
        if let Some(m) = meta.get(META_KEY) {
            sd.metadata = serde_json::from_str(m)
                .map_err(|e| format!("metadata entry {META_KEY:?} is not a JSON object: {e}"))?;
        }
        let order: Vec<String> = match meta.get(ORDER_KEY) {
            Some(o) => serde_json::from_str(o)
                .map_err(|e| format!("metadata entry {ORDER_KEY:?} is not a JSON list of names: {e}"))?,
            None => {
                let mut names: Vec<String> = tensors.keys().cloned().collect();
                names.sort();
                names
            }
        };
        if order.len() != tensors.len() {
            return Err(format!(
                "the file holds {} tensors but its order lists {}",
                tensors.len(),
                order.len()
            ));
        }
        for name in order {
            let t = tensors
                .remove(&name)
                .ok_or_else(|| format!("the order lists {name:?}, which the file lacks"))?;
            sd.insert(name, t);
        }
        Ok(sd)
    }
}

impl FromIterator<(String, Tensor)> for StateDict {
    /// A state dict of the tensors in iteration order, without metadata.
    fn from_iter<I: IntoIterator<Item = (String, Tensor)>>(iter: I) -> StateDict {
        let mut sd = StateDict::new();
        for (k, t) in iter {
            sd.insert(k, t);
        }
        sd
    }
}

impl std::ops::Index<&str> for StateDict {
    type Output = Tensor;

    /// The tensor under `name`, as `HashMap`'s indexing.
    ///
    /// # Panics
    ///
    /// When there is none, with a message naming the key; use
    /// [`StateDict::tensor`] or [`StateDict::require`] for an `Option` or a
    /// `Result`.
    fn index(&self, name: &str) -> &Tensor {
        match self.tensor(name) {
            Some(t) => t,
            None => panic!("the state dict has no tensor {name:?}"),
        }
    }
}

impl IntoIterator for StateDict {
    type Item = (String, Tensor);
    type IntoIter = std::vec::IntoIter<(String, Tensor)>;

    /// The tensors with their names, in insertion order (the metadata is
    /// dropped).
    fn into_iter(self) -> Self::IntoIter {
        self.tensors.into_iter()
    }
}

impl From<HashMap<String, Tensor>> for StateDict {
    /// A state dict of the tensors sorted by name (a `HashMap` has no
    /// order), as [`crate::safetensors::load`] returns them.
    fn from(map: HashMap<String, Tensor>) -> StateDict {
        let mut v: Vec<(String, Tensor)> = map.into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.into_iter().collect()
    }
}

#[cfg(test)]
#[path = "state_dict_tests.rs"]
mod tests;
