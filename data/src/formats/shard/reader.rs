//! [`ShardReader`]: a memory-mapped shard with O(1) access to any record,
//! checked against its CRC-32; [`ShardSet`]: several shards as one dataset.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::{
    row_len, Field, FieldKind, Record, Value, FIELD_LEN, HEADER_LEN, MAGIC, MAX_FIELDS, NAME_LEN, ROW_BASE,
    VERSION,
};
use crate::{Array, Dataset, Error, Image, Result};

/// One shard file, memory-mapped (pages come from the OS cache, shared by
/// every worker). The header and tables are validated when opening; each
/// record is validated (bounds, CRC-32, field sizes) when read.
pub struct ShardReader {
    path: PathBuf,
    map: Mmap,
    schema: Arc<[Field]>,
    /// For each field, its slot among the inline i64 values (i64 fields only).
    inline_slot: Vec<Option<usize>>,
    len: usize,
    index_offset: usize,
    row: usize,
    payload_offset: u64,
    verify: bool,
}

impl ShardReader {
    /// Opens and validates the shard at `path`. Errors, naming the file, when
    /// it cannot be read, its magic or version is wrong, its header CRC does
    /// not match, its tables are inconsistent, or it is truncated.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        // SAFETY: the mapping is read-only; shards are written once and
        // renamed into place, never modified while mapped.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        let bad = |msg: String| Error::format(&path, msg);
        let actual = map.len() as u64;
        if map.len() < HEADER_LEN {
            return Err(bad(format!(
                "truncated: {actual} bytes, shorter than the {HEADER_LEN}-byte header"
            )));
        }
        if map[..8] != MAGIC {
            return Err(bad(format!("not a tessera shard (magic {:02x?})", &map[..8])));
        }
        let version = le_u32(&map, 8);
        if version != VERSION {
            return Err(bad(format!(
                "format version {version}, this reader reads {VERSION}"
            )));
        }
        let nf = le_u32(&map, 12) as usize;
        let n = le_u64(&map, 16);
        let index_offset = le_u64(&map, 24);
        let row = le_u32(&map, 32) as usize;
        let payload_offset = le_u64(&map, 40);
        let file_size = le_u64(&map, 48);
        if !(1..=MAX_FIELDS).contains(&nf) {
            return Err(bad(format!("field count {nf} is not in 1..={MAX_FIELDS}")));
        }
        if file_size != actual {
            return Err(bad(format!(
                "truncated or extended: header says {file_size} bytes, file has {actual}"
            )));
        }
        let meta_end = HEADER_LEN + FIELD_LEN * nf;
        if map.len() < meta_end {
            return Err(bad(format!("truncated field table: needs {meta_end} bytes")));
        }
        let mut h = crc32fast::Hasher::new();
        h.update(&map[..56]);
        h.update(&map[HEADER_LEN..meta_end]);
        let (want, got) = (le_u32(&map, 56), h.finalize());
        if want != got {
            return Err(bad(format!(
                "header checksum mismatch (stored {want:08x}, computed {got:08x})"
            )));
        }
        let mut fields = Vec::with_capacity(nf);
        for k in 0..nf {
            let d = &map[HEADER_LEN + k * FIELD_LEN..HEADER_LEN + (k + 1) * FIELD_LEN];
            let kind = FieldKind::from_code(d[0])
                .ok_or_else(|| bad(format!("field {k} has unknown type code {}", d[0])))?;
            let raw = &d[8..8 + NAME_LEN];
            let end = raw.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
            let name =
                std::str::from_utf8(&raw[..end]).map_err(|_| bad(format!("field {k} name is not UTF-8")))?;
            fields.push(Field::new(name, kind));
        }
        let expect_row = row_len(&fields);
        let table_end = (n as u128) * (row as u128) + index_offset as u128;
        if index_offset != meta_end as u64 || row != expect_row {
            return Err(bad(format!(
                "index table at {index_offset} with {row}-byte rows; expected {meta_end} and {expect_row}"
            )));
        }
        if table_end > payload_offset as u128 || payload_offset > actual {
            return Err(bad(format!(
                "index table of {n} records ends at {table_end}, past the payload start {payload_offset} (file {actual} bytes)"
            )));
        }
        let mut slot = 0;
        let inline_slot = fields
            .iter()
            .map(|f| {
                (f.kind == FieldKind::I64).then(|| {
                    slot += 1;
                    slot - 1
                })
            })
            .collect();
        Ok(ShardReader {
            path,
            map,
            schema: fields.into(),
            inline_slot,
            len: n as usize,
            index_offset: index_offset as usize,
            row,
            payload_offset,
            verify: true,
        })
    }

    /// Turns per-record CRC checks on (the default) or off.
    pub fn verify_checksums(mut self, on: bool) -> Self {
        self.verify = on;
        self
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fields of every record.
    pub fn schema(&self) -> &[Field] {
        &self.schema
    }

    /// Inline i64 field `field` of record `index` read from the index table
    /// alone (no payload access, no CRC check): a fast label scan. Errors
    /// when the index or field is out of range or the field is not i64.
    pub fn inline_i64(&self, index: usize, field: usize) -> Result<i64> {
        Error::check_index("ShardReader::inline_i64", index, self.len)?;
        let slot = self.inline_slot.get(field).copied().flatten().ok_or_else(|| {
            Error::arg(
                "ShardReader::inline_i64",
                format!("field {field} is not an i64 field"),
            )
        })?;
        Ok(le_u64(
            &self.map,
            self.index_offset + index * self.row + ROW_BASE + 8 * slot,
        ) as i64)
    }

    /// Record `index`'s payload bytes and inline bytes, checked against the
    /// index (bounds) and the CRC. Errors name the file and the record.
    pub fn raw(&self, index: usize) -> Result<(&[u8], &[u8])> {
        Error::check_index("ShardReader::raw", index, self.len)?;
        let r = self.index_offset + index * self.row;
        let row = &self.map[r..r + self.row];
        let (off, len, crc) = (le_u64(row, 0), le_u64(row, 8), le_u32(row, 16));
        let end = off
            .checked_add(len)
            .filter(|&e| off >= self.payload_offset && e <= self.map.len() as u64);
        let Some(end) = end else {
            return Err(self.corrupt(
                index,
                format!(
                    "payload [{off}, +{len}) is outside the payload region [{}, {})",
                    self.payload_offset,
                    self.map.len()
                ),
            ));
        };
        let payload = &self.map[off as usize..end as usize];
        let inline = &row[ROW_BASE..];
        if self.verify {
            let got = super::record_crc(payload, inline);
            if got != crc {
                return Err(self.corrupt(
                    index,
                    format!("checksum mismatch (stored {crc:08x}, computed {got:08x})"),
                ));
            }
        }
        Ok((payload, inline))
    }

    /// Decodes record `index`. Errors, naming the file and the record, when
    /// it is out of range, fails its checksum, or its fields do not decode.
    pub fn record(&self, index: usize) -> Result<Record> {
        let (payload, inline) = self.raw(index)?;
        let mut cur = Cursor { buf: payload, pos: 0 };
        let mut values = Vec::with_capacity(self.schema.len());
        for (f, slot) in self.schema.iter().zip(&self.inline_slot) {
            let v = match (f.kind, slot) {
                (FieldKind::I64, Some(s)) => Value::I64(le_u64(inline, 8 * s) as i64),
                (FieldKind::Bytes, _) => {
                    let n = cur.u64().ok_or_else(|| self.short(index, f))?;
                    Value::Bytes(cur.take(n).ok_or_else(|| self.short(index, f))?.to_vec())
                }
                (FieldKind::ImageU8, _) => {
                    let dims = (cur.u32(), cur.u32(), cur.u32());
                    let (Some(h), Some(w), Some(c)) = dims else {
                        return Err(self.short(index, f));
                    };
                    let n = (h as u64) * (w as u64) * (c as u64);
                    let px = cur.take(n).ok_or_else(|| self.short(index, f))?;
                    Value::Image(Image::new(h as usize, w as usize, c as usize, px.to_vec())?)
                }
                _ => {
                    let ndim = cur.u32().ok_or_else(|| self.short(index, f))?;
                    let mut shape = Vec::new();
                    let mut numel = 1u64;
                    for _ in 0..ndim {
                        let d = cur.u32().ok_or_else(|| self.short(index, f))?;
                        shape.push(d as usize);
                        numel = numel.saturating_mul(d as u64);
                    }
                    let raw = cur
                        .take(numel.saturating_mul(4))
                        .ok_or_else(|| self.short(index, f))?;
                    let data = raw
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    Value::F32(Array::new(shape, data)?)
                }
            };
            values.push(v);
        }
        if cur.pos != payload.len() {
            return Err(self.corrupt(
                index,
                format!(
                    "{} payload bytes left after the last field",
                    payload.len() - cur.pos
                ),
            ));
        }
        Ok(Record::from_parts(self.schema.clone(), values))
    }

    fn corrupt(&self, index: usize, msg: String) -> Error {
        Error::corrupt(&self.path, index as u64, msg)
    }

    fn short(&self, index: usize, f: &Field) -> Error {
        self.corrupt(index, format!("payload ends inside field {:?}", f.name))
    }
}

impl Dataset for ShardReader {
    type Item = Record;
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<Record> {
        self.record(index)
    }
}

/// Several shards with one schema, read as one dataset (shard after shard).
pub struct ShardSet {
    shards: Vec<ShardReader>,
    /// `starts[k]` = index of shard k's first record; one extra entry = len.
    starts: Vec<usize>,
}

impl ShardSet {
    /// Opens every shard in `paths`. Errors when one fails to open or their
    /// schemas differ.
    pub fn open<P: AsRef<Path>>(paths: &[P]) -> Result<Self> {
        let shards = paths.iter().map(ShardReader::open).collect::<Result<Vec<_>>>()?;
        Self::new(shards)
    }

    /// A set over opened shards; errors when their schemas differ.
    pub fn new(shards: Vec<ShardReader>) -> Result<Self> {
        let mut starts = vec![0];
        for s in &shards {
            if s.schema() != shards[0].schema() {
                return Err(Error::format(
                    s.path(),
                    format!(
                        "schema {:?} differs from {:?} of {}",
                        s.schema(),
                        shards[0].schema(),
                        shards[0].path().display()
                    ),
                ));
            }
            starts.push(starts[starts.len() - 1] + s.len);
        }
        Ok(ShardSet { shards, starts })
    }

    /// The shards.
    pub fn shards(&self) -> &[ShardReader] {
        &self.shards
    }
}

impl Dataset for ShardSet {
    type Item = Record;
    fn len(&self) -> usize {
        self.starts[self.starts.len() - 1]
    }
    fn get(&self, index: usize) -> Result<Record> {
        Error::check_index("ShardSet::get", index, self.len())?;
        let k = self.starts.partition_point(|&s| s <= index) - 1;
        self.shards[k].record(index - self.starts[k])
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64) -> Option<&'a [u8]> {
        let n = usize::try_from(n).ok()?;
        let s = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| le_u32(b, 0))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| le_u64(b, 0))
    }
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4-byte slice"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8-byte slice"))
}
