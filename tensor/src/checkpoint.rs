//! [`Checkpoint`]: everything a training run needs to resume — model,
//! optimizer, LR schedule, loss scaler, RNG states, epoch and step, user
//! metadata — in one safetensors file, written atomically and durably and
//! checked by a CRC when read.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::Value;

use crate::rng::{self, RngState};
use crate::{safetensors, Error, Result, StateDict};

const SAVE: &str = "Checkpoint::save";
const LOAD: &str = "Checkpoint::load";

/// The file-metadata key of the CRC-32 of the whole file (computed with
/// this entry's value as eight zeros).
const CRC_KEY: &str = "tessera.crc32";
const CRC_PLACEHOLDER: &str = "00000000";
/// The checkpoint layout version, for readers of later layouts.
const VERSION: u64 = 1;

/// The parts a checkpoint holds besides the model, with their prefixes in
/// the file.
const PARTS: [&str; 3] = ["optimizer", "scheduler", "scaler"];

/// A training checkpoint: the state dicts of the model, optimizer, LR
/// schedule and loss scaler, the random generators' states, the epoch and
/// step, and user metadata, saved as one safetensors file.
///
/// Tensors are stored under the part's prefix (`model.fc1.weight`,
/// `optimizer.state.0.exp_avg`), so the model's weights can be read by any
/// safetensors reader. [`Checkpoint::save`] writes a temporary file in the
/// same directory, syncs it, renames it over the target and syncs the
/// directory: a crash leaves the old checkpoint or the new one, never a
/// torn file, and temporary files of a killed save are removed by the next
/// save. The file's mode follows the umask. A CRC-32 of the file is stored
/// in its metadata; [`Checkpoint::load`] recomputes it, so a flipped or
/// truncated byte is an error naming the file, not silently resumed weights.
///
/// ```
/// use tessera_tensor::{Checkpoint, StateDict, Tensor};
/// let dir = std::env::temp_dir().join(format!("ckpt-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).ok();
/// let mut model = StateDict::new();
/// model.insert("fc.weight", Tensor::ones(&[2, 2], tessera_tensor::DType::F32)?);
/// let ckpt = Checkpoint::new(model).at(3, 1200).with_meta("best_acc", 0.981);
/// ckpt.save(dir.join("last.safetensors"))?;
///
/// let back = Checkpoint::load(dir.join("last.safetensors"))?;
/// assert_eq!((back.epoch, back.step), (3, 1200));
/// assert_eq!(back.meta::<f64>("best_acc")?, 0.981);
/// assert!(back.model.contains("fc.weight"));
/// back.restore_default_rng()?; // the random stream continues where it was saved
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), tessera_tensor::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Checkpoint {
    /// The model's state dict.
    pub model: StateDict,
    /// The optimizer's state dict, when saved.
    pub optimizer: Option<StateDict>,
    /// The LR schedule's state dict, when saved.
    pub scheduler: Option<StateDict>,
    /// The loss scaler's state dict, when saved.
    pub scaler: Option<StateDict>,
    /// Random generator states by name; [`Checkpoint::new`] records this
    /// thread's default generator as `"default"`.
    pub rng: BTreeMap<String, RngState>,
    /// Epochs completed.
    pub epoch: u64,
    /// Optimizer steps taken.
    pub step: u64,
    /// The user's metadata (best accuracy, the run's arguments, ...).
    pub metadata: BTreeMap<String, Value>,
}

impl Checkpoint {
    /// A checkpoint of `model` at epoch 0, step 0, holding the state of this
    /// thread's default generator under `"default"`.
    pub fn new(model: StateDict) -> Checkpoint {
        Checkpoint {
            model,
            rng: BTreeMap::from([("default".to_string(), rng::default_state())]),
            ..Checkpoint::default()
        }
    }

    /// Sets the epochs completed and steps taken.
    pub fn at(mut self, epoch: u64, step: u64) -> Checkpoint {
        self.epoch = epoch;
        self.step = step;
        self
    }

    /// Adds the optimizer's state dict.
    pub fn with_optimizer(mut self, sd: StateDict) -> Checkpoint {
        self.optimizer = Some(sd);
        self
    }

    /// Adds the LR schedule's state dict.
    pub fn with_scheduler(mut self, sd: StateDict) -> Checkpoint {
        self.scheduler = Some(sd);
        self
    }

    /// Adds the loss scaler's state dict.
    pub fn with_scaler(mut self, sd: StateDict) -> Checkpoint {
        self.scaler = Some(sd);
        self
    }

    /// Records a generator's state under `name`.
    pub fn with_rng(mut self, name: impl Into<String>, state: RngState) -> Checkpoint {
        self.rng.insert(name.into(), state);
        self
    }

    /// Records user metadata under `key`.
    pub fn with_meta(mut self, key: impl Into<String>, value: impl Into<Value>) -> Checkpoint {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// The user metadata under `key` as `T`. Errors, naming the key and the
    /// value, when it is missing or of another type.
    pub fn meta<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<T> {
        let v = self
            .metadata
            .get(key)
            .ok_or_else(|| Error::arg("Checkpoint::meta", format!("no metadata entry {key:?}")))?;
        T::deserialize(v)
            .map_err(|e| Error::arg("Checkpoint::meta", format!("metadata entry {key:?} = {v}: {e}")))
    }

    /// The optimizer's state dict. Errors when the checkpoint has none.
    pub fn optimizer(&self) -> Result<&StateDict> {
        part(&self.optimizer, "optimizer")
    }

    /// The LR schedule's state dict. Errors when the checkpoint has none.
    pub fn scheduler(&self) -> Result<&StateDict> {
        part(&self.scheduler, "scheduler")
    }

    /// The loss scaler's state dict. Errors when the checkpoint has none.
    pub fn scaler(&self) -> Result<&StateDict> {
        part(&self.scaler, "scaler")
    }

    /// Restores this thread's default generator to the state saved as
    /// `"default"`. Errors when the checkpoint has none.
    pub fn restore_default_rng(&self) -> Result<()> {
        let state = self.rng.get("default").ok_or_else(|| {
            Error::arg(
                "Checkpoint::restore_default_rng",
                "the checkpoint holds no \"default\" generator state",
            )
        })?;
        rng::set_default_state(*state);
        Ok(())
    }

    /// Writes the checkpoint to `path` atomically and durably (see the type's
    /// docs). Errors, naming the file, on I/O failure (`path` is then left as
    /// it was) or a tensor not on the CPU.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let err = |msg: String| Error::io(SAVE, format!("{}: {msg}", path.display()));
        let bytes = self.to_bytes().map_err(err)?;
        crate::durable::write(SAVE, path, &bytes)
    }

    /// Reads a checkpoint written by [`Checkpoint::save`]. Tensors are
    /// memory-mapped, as [`safetensors::load`]'s. Errors, naming the file,
    /// when it cannot be read, is not a tessera checkpoint, is truncated, or
    /// fails its CRC (a changed byte anywhere in it).
    pub fn load(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        let map = safetensors::map_file(LOAD, path)?;
        Checkpoint::from_bytes(map).map_err(|msg| Error::io(LOAD, format!("{}: {msg}", path.display())))
    }

    /// The file's bytes, with the CRC filled in.
    fn to_bytes(&self) -> std::result::Result<Vec<u8>, String> {
        let mut all = StateDict::new();
        all.merge_prefixed("model", self.model.clone());
        let mut parts = vec!["model"];
        for (name, sd) in PARTS.into_iter().zip(self.optional_parts()) {
            if let Some(sd) = sd {
                all.merge_prefixed(name, sd.clone());
                parts.push(name);
            }
        }
        let info = serde_json::json!({
            "version": VERSION,
            "parts": parts,
            "epoch": self.epoch,
            "step": self.step,
            "rng": self.rng,
            "user": self.metadata,
        });
        all.set("checkpoint", info);
        let extra = HashMap::from([(CRC_KEY.to_string(), CRC_PLACEHOLDER.to_string())]);
        let mut bytes = all.to_safetensors(extra)?;
        let at = crc_field(&bytes, CRC_PLACEHOLDER).ok_or("the CRC field is not in the serialised header")?;
        let crc = crc32fast::hash(&bytes);
        bytes[at..at + 8].copy_from_slice(format!("{crc:08x}").as_bytes());
        Ok(bytes)
    }

    fn from_bytes(map: std::sync::Arc<memmap2::Mmap>) -> std::result::Result<Checkpoint, String> {
        let (tensors, meta) = safetensors::parse(map.clone())?;
        let stored = meta
            .get(CRC_KEY)
            .ok_or("not a tessera checkpoint: the file has no CRC entry")?;
        let at = crc_field(&map, stored)
            .filter(|_| stored.len() == 8)
            .ok_or_else(|| format!("the CRC entry {stored:?} is malformed"))?;
        let mut h = crc32fast::Hasher::new();
        h.update(&map[..at]);
        h.update(CRC_PLACEHOLDER.as_bytes());
        h.update(&map[at + 8..]);
        let crc = format!("{:08x}", h.finalize());
        if &crc != stored {
            return Err(format!(
                "checksum mismatch (stored {stored}, computed {crc}): the file is corrupt"
            ));
        }
        let all = StateDict::from_safetensors(tensors, &meta)?;
        let info = all
            .meta("Checkpoint::load", "checkpoint")
            .map_err(|_| "not a tessera checkpoint: no \"checkpoint\" entry".to_string())?;
        let info: Info = serde_json::from_value(info.clone())
            .map_err(|e| format!("the \"checkpoint\" entry is malformed: {e}"))?;
        if info.version > VERSION {
            return Err(format!(
                "checkpoint layout version {} is newer than this tessera's ({VERSION})",
                info.version
            ));
        }
        let has = |p: &str| info.parts.iter().any(|q| q == p);
        let take = |p: &str| has(p).then(|| all.prefixed(p));
        Ok(Checkpoint {
            model: all.prefixed("model"),
            optimizer: take("optimizer"),
            scheduler: take("scheduler"),
            scaler: take("scaler"),
            rng: info.rng,
            epoch: info.epoch,
            step: info.step,
            metadata: info.user,
        })
    }

    fn optional_parts(&self) -> [&Option<StateDict>; 3] {
        [&self.optimizer, &self.scheduler, &self.scaler]
    }
}

/// The `"checkpoint"` metadata entry.
#[derive(serde::Deserialize)]
struct Info {
    version: u64,
    parts: Vec<String>,
    epoch: u64,
    step: u64,
    rng: BTreeMap<String, RngState>,
    user: BTreeMap<String, Value>,
}

fn part<'a>(sd: &'a Option<StateDict>, name: &str) -> Result<&'a StateDict> {
    sd.as_ref().ok_or_else(|| {
        Error::arg(
            "Checkpoint",
            format!("the checkpoint holds no {name} state (it was saved without one)"),
        )
    })
}

/// The offset of the CRC value `value` in the header of safetensors bytes:
/// the position after `"tessera.crc32":"`, when that key appears exactly
/// once in the header.
fn crc_field(bytes: &[u8], value: &str) -> Option<usize> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let header = bytes.get(8..8usize.checked_add(usize::try_from(n).ok()?)?)?;
    let needle = format!("\"{CRC_KEY}\":\"{value}\"");
    let needle = needle.as_bytes();
    let mut hits = header
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i);
    let first = hits.next()?;
    if hits.next().is_some() {
        return None;
    }
    Some(8 + first + needle.len() - value.len() - 1)
}

#[cfg(test)]
#[path = "checkpoint_tests.rs"]
mod tests;
