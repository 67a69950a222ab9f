//! [`ShardWriter`] and [`write_shards`]: records in, shard files out.
//!
//! Payloads are spooled to a side file while records arrive (the index
//! table, which precedes them, is only complete at the end); `finish`
//! writes header, field table and index, appends the payload and renames
//! the result into place, so a shard is never seen half-written.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::{
    check_schema, record_crc, row_len, Field, Value, FIELD_LEN, HEADER_LEN, MAGIC, NAME_LEN, VERSION,
};
use crate::{Dataset, Error, Result};

/// Writes one shard file; see `data/FORMAT.md`.
pub struct ShardWriter {
    path: PathBuf,
    spool_path: PathBuf,
    spool: BufWriter<File>,
    fields: Vec<Field>,
    /// Index rows with offsets relative to the payload start.
    rows: Vec<u8>,
    payload_len: u64,
    count: u64,
    scratch: Vec<u8>,
}

impl ShardWriter {
    /// Starts a shard at `path` with `fields`. Errors on an invalid schema
    /// (see [`Field`]) or when the spool file cannot be created.
    pub fn create(path: impl AsRef<Path>, fields: &[Field]) -> Result<Self> {
        check_schema("ShardWriter::create", fields)?;
        let path = path.as_ref().to_path_buf();
        let spool_path = sibling(&path, "payload-tmp");
        let spool = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&spool_path)
            .map_err(|e| Error::io(&spool_path, e))?;
        Ok(ShardWriter {
            path,
            spool_path,
            spool: BufWriter::new(spool),
            fields: fields.to_vec(),
            rows: Vec::new(),
            payload_len: 0,
            count: 0,
            scratch: Vec::new(),
        })
    }

    /// Records written so far.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// True before the first record.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Payload bytes written so far.
    pub fn payload_bytes(&self) -> u64 {
        self.payload_len
    }

    /// Appends a record: one value per field, in schema order. Errors when
    /// the values do not match the schema or a size exceeds the format's
    /// u32 fields; nothing is written then.
    pub fn append(&mut self, values: &[Value]) -> Result<()> {
        const OP: &str = "ShardWriter::append";
        if values.len() != self.fields.len() {
            return Err(Error::arg(
                OP,
                format!("{} values for {} fields", values.len(), self.fields.len()),
            ));
        }
        let p = &mut self.scratch;
        p.clear();
        let mut inline = Vec::new();
        for (f, v) in self.fields.iter().zip(values) {
            if v.kind() != f.kind {
                return Err(Error::arg(
                    OP,
                    format!(
                        "field {:?} is {:?} but the value is {:?}",
                        f.name,
                        f.kind,
                        v.kind()
                    ),
                ));
            }
            match v {
                Value::Bytes(b) => {
                    p.extend_from_slice(&(b.len() as u64).to_le_bytes());
                    p.extend_from_slice(b);
                }
                Value::Image(im) => {
                    for d in im.shape() {
                        p.extend_from_slice(&u32_of(OP, d)?.to_le_bytes());
                    }
                    p.extend_from_slice(im.data());
                }
                Value::I64(x) => inline.extend_from_slice(&x.to_le_bytes()),
                Value::F32(a) => {
                    if a.data.len() != a.shape.iter().product::<usize>() {
                        return Err(Error::arg(
                            OP,
                            format!("f32 array of shape {:?} holds {} values", a.shape, a.data.len()),
                        ));
                    }
                    p.extend_from_slice(&u32_of(OP, a.shape.len())?.to_le_bytes());
                    for &d in &a.shape {
                        p.extend_from_slice(&u32_of(OP, d)?.to_le_bytes());
                    }
                    for &x in &a.data {
                        p.extend_from_slice(&x.to_le_bytes());
                    }
                }
            }
        }
        let crc = record_crc(p, &inline);
        let len = p.len() as u64;
        let pad = (8 - (len % 8)) % 8;
        let spool_err = |e| Error::io(&self.spool_path, e);
        self.spool.write_all(p).map_err(spool_err)?;
        self.spool
            .write_all(&[0u8; 8][..pad as usize])
            .map_err(spool_err)?;
        self.rows.extend_from_slice(&self.payload_len.to_le_bytes());
        self.rows.extend_from_slice(&len.to_le_bytes());
        self.rows.extend_from_slice(&crc.to_le_bytes());
        self.rows.extend_from_slice(&0u32.to_le_bytes());
        self.rows.extend_from_slice(&inline);
        self.payload_len += len + pad;
        self.count += 1;
        Ok(())
    }

    /// Writes the shard and returns its path. Errors when writing fails.
    pub fn finish(mut self) -> Result<PathBuf> {
        let path = self.path.clone();
        let tmp = sibling(&path, "tmp");
        self.spool.flush().map_err(|e| Error::io(&self.spool_path, e))?;
        let nf = self.fields.len();
        let row = row_len(&self.fields);
        let index_offset = (HEADER_LEN + FIELD_LEN * nf) as u64;
        let index_end = index_offset + self.count * row as u64;
        let payload_offset = index_end.div_ceil(8) * 8;
        let file_size = payload_offset + self.payload_len;

        let mut meta = Vec::with_capacity(HEADER_LEN + FIELD_LEN * nf);
        meta.extend_from_slice(&MAGIC);
        meta.extend_from_slice(&VERSION.to_le_bytes());
        meta.extend_from_slice(&(nf as u32).to_le_bytes());
        meta.extend_from_slice(&self.count.to_le_bytes());
        meta.extend_from_slice(&index_offset.to_le_bytes());
        meta.extend_from_slice(&(row as u32).to_le_bytes());
        meta.extend_from_slice(&0u32.to_le_bytes());
        meta.extend_from_slice(&payload_offset.to_le_bytes());
        meta.extend_from_slice(&file_size.to_le_bytes());
        let mut table = Vec::with_capacity(FIELD_LEN * nf);
        for f in &self.fields {
            table.push(f.kind.code());
            table.extend_from_slice(&[0u8; 7]);
            let mut name = [0u8; NAME_LEN];
            name[..f.name.len()].copy_from_slice(f.name.as_bytes());
            table.extend_from_slice(&name);
        }
        let mut h = crc32fast::Hasher::new();
        h.update(&meta);
        h.update(&table);
        meta.extend_from_slice(&h.finalize().to_le_bytes());
        meta.extend_from_slice(&0u32.to_le_bytes());
        meta.extend_from_slice(&table);

        // Rows hold offsets relative to the payload: make them absolute.
        for r in self.rows.chunks_exact_mut(row) {
            let rel = u64::from_le_bytes(r[..8].try_into().expect("8-byte slice"));
            r[..8].copy_from_slice(&(rel + payload_offset).to_le_bytes());
        }

        let io = |e| Error::io(&tmp, e);
        let mut out = BufWriter::new(File::create(&tmp).map_err(io)?);
        out.write_all(&meta).map_err(io)?;
        out.write_all(&self.rows).map_err(io)?;
        out.write_all(&vec![0u8; (payload_offset - index_end) as usize])
            .map_err(io)?;
        let mut spool = self
            .spool
            .into_inner()
            .map_err(|e| Error::io(&self.spool_path, e.into_error()))?;
        spool
            .seek(SeekFrom::Start(0))
            .map_err(|e| Error::io(&self.spool_path, e))?;
        std::io::copy(&mut spool, &mut out).map_err(io)?;
        out.flush().map_err(io)?;
        drop(out);
        drop(spool);
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
        std::fs::remove_file(&self.spool_path).map_err(|e| Error::io(&self.spool_path, e))?;
        Ok(path)
    }
}

fn u32_of(op: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::arg(op, format!("size {n} does not fit the format's u32")))
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{suffix}"));
    PathBuf::from(s)
}

/// Writes every sample of `dataset` into shards `dir/{stem}-00000.tshard`,
/// `-00001`, ... of at most `records_per_shard` records, converting each
/// sample with `to_values` (one value per field of `fields`). Returns the
/// shard paths. Errors when reading a sample, converting it or writing fails.
pub fn write_shards<D, F>(
    dataset: &D,
    fields: &[Field],
    dir: impl AsRef<Path>,
    stem: &str,
    records_per_shard: usize,
    to_values: F,
) -> Result<Vec<PathBuf>>
where
    D: Dataset,
    F: Fn(D::Item) -> Result<Vec<Value>>,
{
    if records_per_shard == 0 {
        return Err(Error::arg("write_shards", "records_per_shard must be positive"));
    }
    let dir = dir.as_ref();
    let mut paths = Vec::new();
    let mut writer: Option<ShardWriter> = None;
    for i in 0..dataset.len() {
        let w = match &mut writer {
            Some(w) => w,
            None => writer.insert(ShardWriter::create(
                dir.join(format!("{stem}-{:05}.tshard", paths.len())),
                fields,
            )?),
        };
        w.append(&to_values(dataset.get(i)?)?)?;
        if w.len() as usize == records_per_shard {
            if let Some(w) = writer.take() {
                paths.push(w.finish()?);
            }
        }
    }
    if let Some(w) = writer {
        paths.push(w.finish()?);
    }
    Ok(paths)
}
