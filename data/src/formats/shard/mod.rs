//! tessera's record-shard format: a header, a field table, a fixed-size
//! index row per record (O(1) random access, inline i64 fields), then the
//! record payloads, each with a CRC-32. Byte-by-byte layout: `data/FORMAT.md`.
//! Written by [`ShardWriter`], read memory-mapped by [`ShardReader`].

mod reader;
mod writer;

pub use reader::{ShardReader, ShardSet};
pub use writer::{write_shards, ShardWriter};

use std::sync::Arc;

use crate::{Array, Error, Image, Result};

/// The first 8 bytes of every shard file.
pub const MAGIC: [u8; 8] = *b"TSRSHARD";
/// The format version this crate writes and reads.
pub const VERSION: u32 = 1;
/// Bytes in the header.
pub const HEADER_LEN: usize = 64;
/// Bytes per field descriptor.
pub const FIELD_LEN: usize = 32;
/// Bytes of a field name, at most.
pub const NAME_LEN: usize = 24;
/// Bytes of an index row before the inline i64 values.
pub const ROW_BASE: usize = 24;
/// Largest number of fields in one shard.
pub const MAX_FIELDS: usize = 64;

/// The type of a field; the code is its byte in the field table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// Code 0: raw bytes of any length.
    Bytes,
    /// Code 1: an 8-bit image with its height, width and channels (HWC).
    ImageU8,
    /// Code 2: one i64, stored inline in the index row.
    I64,
    /// Code 3: an f32 array with its shape.
    F32Array,
}

impl FieldKind {
    /// The code written in the field table.
    pub fn code(self) -> u8 {
        match self {
            FieldKind::Bytes => 0,
            FieldKind::ImageU8 => 1,
            FieldKind::I64 => 2,
            FieldKind::F32Array => 3,
        }
    }

    /// The kind of `code`, if any.
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => FieldKind::Bytes,
            1 => FieldKind::ImageU8,
            2 => FieldKind::I64,
            3 => FieldKind::F32Array,
            _ => return None,
        })
    }
}

/// A named, typed field of every record in a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The name (1 to 24 bytes of UTF-8, unique within the shard).
    pub name: String,
    /// The type.
    pub kind: FieldKind,
}

impl Field {
    /// A field called `name` of type `kind`.
    pub fn new(name: impl Into<String>, kind: FieldKind) -> Self {
        Field {
            name: name.into(),
            kind,
        }
    }
}

/// One field's value in a record.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A [`FieldKind::Bytes`] value.
    Bytes(Vec<u8>),
    /// A [`FieldKind::ImageU8`] value.
    Image(Image),
    /// A [`FieldKind::I64`] value.
    I64(i64),
    /// A [`FieldKind::F32Array`] value.
    F32(Array<f32>),
}

impl Value {
    /// The kind of field that stores this value.
    pub fn kind(&self) -> FieldKind {
        match self {
            Value::Bytes(_) => FieldKind::Bytes,
            Value::Image(_) => FieldKind::ImageU8,
            Value::I64(_) => FieldKind::I64,
            Value::F32(_) => FieldKind::F32Array,
        }
    }
}

/// A decoded record: one value per field of the shard's schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    schema: Arc<[Field]>,
    values: Vec<Value>,
}

impl Record {
    /// The fields, in order.
    pub fn schema(&self) -> &[Field] {
        &self.schema
    }

    /// The values, in field order.
    pub fn values(&self) -> &[Value] {
        &self.values
    }

    /// The values, in field order, by value.
    pub fn into_values(self) -> Vec<Value> {
        self.values
    }

    /// The value of field `name`; errors when there is no such field.
    pub fn value(&self, name: &str) -> Result<&Value> {
        let k = self.position(name)?;
        Ok(&self.values[k])
    }

    /// Removes and returns field `name`'s image (leaving an empty one);
    /// errors when the field is missing or not an image.
    pub fn take_image(&mut self, name: &str) -> Result<Image> {
        let k = self.position(name)?;
        match std::mem::replace(&mut self.values[k], Value::Bytes(Vec::new())) {
            Value::Image(im) => Ok(im),
            other => {
                self.values[k] = other;
                Err(self.wrong(name, "an image"))
            }
        }
    }

    /// Field `name`'s i64; errors when the field is missing or not an i64.
    pub fn i64(&self, name: &str) -> Result<i64> {
        match self.value(name)? {
            Value::I64(v) => Ok(*v),
            _ => Err(self.wrong(name, "an i64")),
        }
    }

    /// Field `name`'s bytes; errors when the field is missing or not bytes.
    pub fn bytes(&self, name: &str) -> Result<&[u8]> {
        match self.value(name)? {
            Value::Bytes(v) => Ok(v),
            _ => Err(self.wrong(name, "bytes")),
        }
    }

    /// Field `name`'s f32 array; errors when the field is missing or not one.
    pub fn f32_array(&self, name: &str) -> Result<&Array<f32>> {
        match self.value(name)? {
            Value::F32(v) => Ok(v),
            _ => Err(self.wrong(name, "an f32 array")),
        }
    }

    fn position(&self, name: &str) -> Result<usize> {
        self.schema.iter().position(|f| f.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.schema.iter().map(|f| f.name.as_str()).collect();
            Error::arg("Record", format!("no field {name:?}; fields are {names:?}"))
        })
    }

    fn wrong(&self, name: &str, want: &str) -> Error {
        Error::arg("Record", format!("field {name:?} is not {want}"))
    }
}

/// Checks a schema: 1 to [`MAX_FIELDS`] fields, names of 1 to
/// [`NAME_LEN`] bytes without NUL, unique.
pub(crate) fn check_schema(op: &'static str, fields: &[Field]) -> Result<()> {
    if fields.is_empty() || fields.len() > MAX_FIELDS {
        return Err(Error::arg(
            op,
            format!("a shard needs 1 to {MAX_FIELDS} fields, got {}", fields.len()),
        ));
    }
    for (k, f) in fields.iter().enumerate() {
        if f.name.is_empty() || f.name.len() > NAME_LEN || f.name.contains('\0') {
            return Err(Error::arg(
                op,
                format!(
                    "field name {:?} must be 1 to {NAME_LEN} bytes without NUL",
                    f.name
                ),
            ));
        }
        if fields[..k].iter().any(|g| g.name == f.name) {
            return Err(Error::arg(op, format!("field name {:?} appears twice", f.name)));
        }
    }
    Ok(())
}

/// Bytes of an index row for `fields`.
pub(crate) fn row_len(fields: &[Field]) -> usize {
    ROW_BASE + 8 * fields.iter().filter(|f| f.kind == FieldKind::I64).count()
}

/// The CRC-32 of a record: its payload, then its inline i64 values (LE).
pub(crate) fn record_crc(payload: &[u8], inline: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(payload);
    h.update(inline);
    h.finalize()
}

impl Record {
    pub(crate) fn from_parts(schema: Arc<[Field]>, values: Vec<Value>) -> Self {
        Record { schema, values }
    }
}
