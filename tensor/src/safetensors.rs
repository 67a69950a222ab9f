//! Reading and writing the [safetensors] format: memory-mapped load and save
//! of every dtype, with the optional `__metadata__` string map. Files are
//! interchangeable with PyTorch's `safetensors.torch.save_file`/`load_file`.
//!
//! ```
//! use tessera_tensor::{safetensors, DType, Tensor};
//! let path = std::env::temp_dir().join(format!("doc-{}.safetensors", std::process::id()));
//! let w = Tensor::arange(0.0, 6.0, 1.0, DType::F32)?.reshape(&[2, 3])?;
//! safetensors::save(&path, [("w", &w.t()?)])?;
//! let loaded = safetensors::load(&path)?;
//! assert_eq!(loaded["w"].shape(), &[3, 2]);
//! assert_eq!(loaded["w"].to_vec::<f32>()?, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), tessera_tensor::Error>(())
//! ```
//!
//! [safetensors]: https://github.com/huggingface/safetensors

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use ::safetensors::tensor::{Dtype as StDtype, SafeTensors, View};

use crate::{DType, Element, Error, Layout, Result, Storage, Tensor};

pub(crate) const LOAD: &str = "safetensors::load";
pub(crate) const SAVE: &str = "safetensors::save";

/// Loads every tensor of the safetensors file at `path`, by name. Tensors
/// whose data is aligned for their dtype (all of them, in files written by
/// this module or by PyTorch) are memory-mapped, not read: the file must
/// not be modified while they are alive. Errors, naming the file, when it
/// cannot be opened or mapped, when its header or offsets are corrupt, when
/// it is truncated, when a tensor has a dtype tessera lacks (e.g. I8, F8),
/// or when a bool tensor holds a byte other than 0 or 1.
pub fn load(path: impl AsRef<Path>) -> Result<HashMap<String, Tensor>> {
    Ok(load_with_metadata(path)?.0)
}

/// As [`load`], also returning the file's `__metadata__` map (empty when
/// the file has none).
pub fn load_with_metadata(
    path: impl AsRef<Path>,
) -> Result<(HashMap<String, Tensor>, HashMap<String, String>)> {
    let path = path.as_ref();
    let map = map_file(LOAD, path)?;
    parse(map).map_err(|msg| Error::io(LOAD, format!("{}: {msg}", path.display())))
}

/// Memory-maps the file at `path`. Errors, naming `op` and the file, when it
/// cannot be opened or mapped or is a directory.
pub(crate) fn map_file(op: &'static str, path: &Path) -> Result<Arc<memmap2::Mmap>> {
    let err = |msg: String| Error::io(op, format!("{}: {msg}", path.display()));
    little_endian_only(op)?;
    if path.is_dir() {
        return Err(err("is a directory, not a safetensors file".into()));
    }
    let file = File::open(path).map_err(|e| err(e.to_string()))?;
    // SAFETY: the map is read-only; like every mmap-based loader (PyTorch's
    // and safetensors' own) we require that the file is not truncated or
    // rewritten while tensors borrow it. `save` replaces files by rename, so
    // saving over a loaded file is safe.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(e.to_string()))?;
    Ok(Arc::new(map))
}

/// A file's tensors by name and its `__metadata__` map.
pub(crate) type Parsed = (HashMap<String, Tensor>, HashMap<String, String>);

/// The tensors (borrowing `map` where aligned) and metadata map of the
/// safetensors bytes in `map`. Errors with a message (the caller adds the
/// file) when the header or offsets are corrupt, the data is truncated, a
/// dtype is unsupported or a bool byte is not 0 or 1.
pub(crate) fn parse(map: Arc<memmap2::Mmap>) -> std::result::Result<Parsed, String> {
    let (header_len, meta) = SafeTensors::read_metadata(&map).map_err(|e| format!("corrupt file: {e}"))?;
    let data_start = 8 + header_len;
    let mut tensors = HashMap::new();
    for (name, info) in meta.tensors() {
        let dtype = from_st_dtype(info.dtype).ok_or_else(|| {
            format!(
                "tensor {name:?} has dtype {:?}, which tessera does not support",
                info.dtype
            )
        })?;
        // read_metadata checked that the offsets match the shape and dtype
        // and lie inside the file.
        let (begin, end) = info.data_offsets;
        let len = (end - begin) / dtype.size_in_bytes();
        let start = data_start + begin;
        let storage = match Storage::mapped(map.clone(), start, dtype, len) {
            Some(s) => s,
            None => copy_storage(&map[start..data_start + end], dtype)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("bool tensor {name:?} holds a byte other than 0 or 1"))?,
        };
        tensors.insert(name, Tensor::from_parts(storage, Layout::contiguous(&info.shape)));
    }
    let metadata = meta.metadata().clone().unwrap_or_default();
    Ok((tensors, metadata))
}

/// Saves `tensors` (name, tensor pairs: an array, a `Vec`, or a
/// `&HashMap<String, Tensor>`) to `path`, replacing it atomically (write to
/// a sibling temporary file, then rename). Non-contiguous tensors are
/// written in row-major order. Errors, naming the file, for a duplicate or
/// reserved (`__metadata__`) name, a tensor not on the CPU, or an I/O failure.
pub fn save<'a, K: AsRef<str>>(
    path: impl AsRef<Path>,
    tensors: impl IntoIterator<Item = (K, &'a Tensor)>,
) -> Result<()> {
    save_impl(path.as_ref(), tensors, None)
}

/// As [`save`], also writing the `__metadata__` string map (PyTorch writes
/// `{"format": "pt"}`).
pub fn save_with_metadata<'a, K: AsRef<str>>(
    path: impl AsRef<Path>,
    tensors: impl IntoIterator<Item = (K, &'a Tensor)>,
    metadata: &HashMap<String, String>,
) -> Result<()> {
    save_impl(path.as_ref(), tensors, Some(metadata.clone()))
}

fn save_impl<'a, K: AsRef<str>>(
    path: &Path,
    tensors: impl IntoIterator<Item = (K, &'a Tensor)>,
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let bytes = serialize(tensors, metadata.unwrap_or_default())
        .map_err(|msg| Error::io(SAVE, format!("{}: {msg}", path.display())))?;
    crate::durable::write(SAVE, path, &bytes)
}

/// The safetensors bytes of `tensors` with the `metadata` map (omitted when
/// empty). Errors with a message (the caller adds the file) for a
/// duplicate or reserved (`__metadata__`) name or a tensor not on the CPU.
pub(crate) fn serialize<'a, K: AsRef<str>>(
    tensors: impl IntoIterator<Item = (K, &'a Tensor)>,
    metadata: HashMap<String, String>,
) -> std::result::Result<Vec<u8>, String> {
    if cfg!(target_endian = "big") {
        return Err("safetensors IO needs a little-endian machine".into());
    }
    let mut seen = HashSet::new();
    let mut views = Vec::new();
    for (name, t) in tensors {
        let name = name.as_ref().to_string();
        if name == "__metadata__" {
            return Err("the name \"__metadata__\" is reserved for the metadata map".into());
        }
        if !seen.insert(name.clone()) {
            return Err(format!("the name {name:?} appears twice"));
        }
        if !t.device().is_cpu() {
            return Err(format!(
                "tensor {name:?} is on {}; move it to the CPU first",
                t.device()
            ));
        }
        views.push((name, TensorBytes(t.contiguous().map_err(|e| e.to_string())?)));
    }
    if metadata.is_empty() {
        return ::safetensors::serialize(views, None).map_err(|e| e.to_string());
    }
    let sorted: BTreeMap<&str, &str> = metadata.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let sorted = serde_json::to_vec(&sorted).map_err(|e| e.to_string())?;
    let mut bytes = ::safetensors::serialize(views, Some(metadata)).map_err(|e| e.to_string())?;
    overwrite_metadata_sorted(&mut bytes, &sorted)?;
    Ok(bytes)
}

/// The safetensors crate writes `__metadata__` as the header's first entry
/// in `HashMap` order, so the same state saved twice could differ byte for
/// byte. The same map with its keys sorted serialises to the same length,
/// so it overwrites the written one in place and saves are reproducible.
fn overwrite_metadata_sorted(bytes: &mut [u8], sorted: &[u8]) -> std::result::Result<(), String> {
    const PREFIX: &[u8] = b"{\"__metadata__\":";
    let start = 8 + PREFIX.len();
    let end = start + sorted.len();
    let fits = bytes.get(8..start) == Some(PREFIX)
        && matches!(bytes.get(end), Some(b',' | b'}'))
        && bytes[start] == b'{'
        && bytes[end - 1] == b'}';
    if !fits {
        return Err("the safetensors header does not start with the metadata map".into());
    }
    bytes[start..end].copy_from_slice(sorted);
    Ok(())
}

/// A contiguous tensor seen as the bytes safetensors writes.
struct TensorBytes(Tensor);

impl View for TensorBytes {
    fn dtype(&self) -> StDtype {
        to_st_dtype(self.0.dtype())
    }

    fn shape(&self) -> &[usize] {
        self.0.shape()
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let size = self.0.dtype().size_in_bytes();
        let start = self.0.layout().offset() * size;
        Cow::Borrowed(&self.0.storage().as_bytes()[start..start + self.data_len()])
    }

    fn data_len(&self) -> usize {
        self.0.numel() * self.0.dtype().size_in_bytes()
    }
}

fn little_endian_only(op: &'static str) -> Result<()> {
    if cfg!(target_endian = "little") {
        Ok(())
    } else {
        Err(Error::io(op, "safetensors IO needs a little-endian machine"))
    }
}

fn to_st_dtype(d: DType) -> StDtype {
    match d {
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::I64 => StDtype::I64,
        DType::U32 => StDtype::U32,
        DType::U8 => StDtype::U8,
        DType::Bool => StDtype::BOOL,
    }
}

fn from_st_dtype(d: StDtype) -> Option<DType> {
    DType::ALL.into_iter().find(|&t| to_st_dtype(t) == d)
}

/// An owned copy of little-endian `bytes` of `dtype` (for data not aligned
/// for in-place use). `None` when a bool byte is neither 0 nor 1; an error
/// when the copy cannot be allocated.
fn copy_storage(bytes: &[u8], dtype: DType) -> Result<Option<Storage>> {
    fn pod<T: Element + bytemuck::Pod>(bytes: &[u8]) -> Result<Storage> {
        let mut s = Storage::for_overwrite::<T>("load", bytes.len() / std::mem::size_of::<T>())?;
        bytemuck::cast_slice_mut::<T, u8>(s.as_mut_slice::<T>("load")?).copy_from_slice(bytes);
        Ok(s)
    }
    Ok(Some(match dtype {
        DType::F32 => pod::<f32>(bytes)?,
        DType::F64 => pod::<f64>(bytes)?,
        DType::F16 => pod::<half::f16>(bytes)?,
        DType::BF16 => pod::<half::bf16>(bytes)?,
        DType::I64 => pod::<i64>(bytes)?,
        DType::U32 => pod::<u32>(bytes)?,
        DType::U8 => pod::<u8>(bytes)?,
        DType::Bool => {
            if bytes.iter().any(|&b| b > 1) {
                return Ok(None);
            }
            let mut s = Storage::for_overwrite::<bool>("load", bytes.len())?;
            for (o, &b) in s.as_mut_slice::<bool>("load")?.iter_mut().zip(bytes) {
                *o = b == 1;
            }
            s
        }
    }))
}

#[cfg(test)]
#[path = "safetensors_tests.rs"]
mod tests;
