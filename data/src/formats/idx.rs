//! The IDX format of MNIST and Fashion-MNIST (LeCun): magic `00 00 TT DD`,
//! `DD` big-endian u32 dimension sizes, then the C-order data (big-endian
//! for multi-byte types). Files may be gzip-compressed (detected by the
//! gzip magic `1f 8b`, whatever the file name).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use tessera_tensor::Tensor;

use crate::{Dataset, Error, Image, Result};

/// The elements of an IDX file, by type code.
#[derive(Debug, Clone, PartialEq)]
pub enum IdxData {
    /// `0x08`: unsigned byte.
    U8(Vec<u8>),
    /// `0x09`: signed byte.
    I8(Vec<i8>),
    /// `0x0B`: i16.
    I16(Vec<i16>),
    /// `0x0C`: i32.
    I32(Vec<i32>),
    /// `0x0D`: f32.
    F32(Vec<f32>),
    /// `0x0E`: f64.
    F64(Vec<f64>),
}

/// A decoded IDX file: its dimensions and elements.
#[derive(Debug, Clone, PartialEq)]
pub struct IdxArray {
    /// The dimension sizes from the header.
    pub dims: Vec<usize>,
    /// The elements, C order.
    pub data: IdxData,
}

impl IdxArray {
    /// The array as a tensor of shape `dims`: u8 stays u8, the signed
    /// integer types become i64, f32 and f64 keep their type.
    pub fn to_tensor(&self) -> Result<Tensor> {
        let d = &self.dims;
        Ok(match &self.data {
            IdxData::U8(v) => Tensor::from_slice(v, d)?,
            IdxData::I8(v) => Tensor::from_vec(v.iter().map(|&x| x as i64).collect::<Vec<_>>(), d)?,
            IdxData::I16(v) => Tensor::from_vec(v.iter().map(|&x| x as i64).collect::<Vec<_>>(), d)?,
            IdxData::I32(v) => Tensor::from_vec(v.iter().map(|&x| x as i64).collect::<Vec<_>>(), d)?,
            IdxData::F32(v) => Tensor::from_slice(v, d)?,
            IdxData::F64(v) => Tensor::from_slice(v, d)?,
        })
    }

    fn type_code(&self) -> u8 {
        match self.data {
            IdxData::U8(_) => 0x08,
            IdxData::I8(_) => 0x09,
            IdxData::I16(_) => 0x0B,
            IdxData::I32(_) => 0x0C,
            IdxData::F32(_) => 0x0D,
            IdxData::F64(_) => 0x0E,
        }
    }
}

/// Reads a whole file, gunzipping it when it starts with the gzip magic.
pub fn read_maybe_gz(path: &Path) -> Result<Vec<u8>> {
    let raw = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| Error::format(path, format!("gzip stream is corrupt: {e}")))?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// Reads an IDX file (raw or gzip). Errors name the file: a bad magic, an
/// unknown type code, or a size that does not match the header.
pub fn read_idx(path: impl AsRef<Path>) -> Result<IdxArray> {
    let path = path.as_ref();
    parse_idx(&read_maybe_gz(path)?, path)
}

/// Decodes IDX bytes; `path` only names the source in errors.
pub fn parse_idx(bytes: &[u8], path: &Path) -> Result<IdxArray> {
    let bad = |msg: String| Error::format(path, msg);
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad(format!(
            "not an IDX file (magic {:02x?})",
            &bytes[..bytes.len().min(4)]
        )));
    }
    let (code, ndim) = (bytes[2], bytes[3] as usize);
    let size = match code {
        0x08 | 0x09 => 1,
        0x0B => 2,
        0x0C | 0x0D => 4,
        0x0E => 8,
        c => return Err(bad(format!("unknown IDX type code 0x{c:02x}"))),
    };
    let header = 4 + 4 * ndim;
    if bytes.len() < header {
        return Err(bad(format!(
            "truncated header: {ndim} dimensions need {header} bytes, file has {}",
            bytes.len()
        )));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let numel = dims.iter().try_fold(1usize, |a, &n| a.checked_mul(n));
    let want = numel
        .and_then(|n| n.checked_mul(size))
        .and_then(|n| n.checked_add(header));
    if want != Some(bytes.len()) {
        return Err(bad(format!(
            "dimensions {dims:?} of {size}-byte elements need {} bytes, file has {}",
            want.map_or("too many".into(), |w| w.to_string()),
            bytes.len()
        )));
    }
    let body = &bytes[header..];
    let data = match code {
        0x08 => IdxData::U8(body.to_vec()),
        0x09 => IdxData::I8(body.iter().map(|&b| b as i8).collect()),
        0x0B => IdxData::I16(
            body.chunks_exact(2)
                .map(|c| i16::from_be_bytes([c[0], c[1]]))
                .collect(),
        ),
        0x0C => IdxData::I32(
            body.chunks_exact(4)
                .map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        0x0D => IdxData::F32(
            body.chunks_exact(4)
                .map(|c| f32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        _ => IdxData::F64(
            body.chunks_exact(8)
                .map(|c| f64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ),
    };
    Ok(IdxArray { dims, data })
}

/// Writes `array` as an IDX file, gzip-compressed when `gzip`. Errors when
/// the element count does not match the dimensions or the write fails.
pub fn write_idx(path: impl AsRef<Path>, array: &IdxArray, gzip: bool) -> Result<()> {
    let path = path.as_ref();
    let mut out = vec![0, 0, array.type_code(), array.dims.len() as u8];
    for &d in &array.dims {
        let d =
            u32::try_from(d).map_err(|_| Error::arg("write_idx", format!("dimension {d} exceeds u32")))?;
        out.extend_from_slice(&d.to_be_bytes());
    }
    let numel: usize = array.dims.iter().product();
    let len = match &array.data {
        IdxData::U8(v) => {
            out.extend_from_slice(v);
            v.len()
        }
        IdxData::I8(v) => extend_be(&mut out, v, |x| x.to_be_bytes()),
        IdxData::I16(v) => extend_be(&mut out, v, |x| x.to_be_bytes()),
        IdxData::I32(v) => extend_be(&mut out, v, |x| x.to_be_bytes()),
        IdxData::F32(v) => extend_be(&mut out, v, |x| x.to_be_bytes()),
        IdxData::F64(v) => extend_be(&mut out, v, |x| x.to_be_bytes()),
    };
    if len != numel {
        return Err(Error::arg(
            "write_idx",
            format!("{len} elements do not fill dimensions {:?}", array.dims),
        ));
    }
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let res = if gzip {
        let mut enc = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        enc.write_all(&out).and_then(|_| enc.finish().map(drop))
    } else {
        let mut f = file;
        f.write_all(&out)
    };
    res.map_err(|e| Error::io(path, e))
}

fn extend_be<T: Copy, const N: usize>(out: &mut Vec<u8>, v: &[T], f: impl Fn(T) -> [u8; N]) -> usize {
    for &x in v {
        out.extend_from_slice(&f(x));
    }
    v.len()
}

/// Where Debian's `dataset-fashion-mnist` package installs Fashion-MNIST
/// (the same four gzipped IDX files as MNIST); open it with [`Mnist::open`].
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// MNIST-layout data (MNIST, Fashion-MNIST, the `datasets/mnist` subset):
/// u8 images `[N, rows, cols]` and labels `[N]`. Samples are
/// `(Image rows×cols×1, label)`.
#[derive(Debug, Clone)]
pub struct Mnist {
    images: Vec<u8>,
    labels: Vec<u8>,
    rows: usize,
    cols: usize,
}

impl Mnist {
    /// Opens the training (`train = true`, files `train-*`) or test (`t10k-*`)
    /// split in `dir`. Accepts `{split}-images-idx3-ubyte` and
    /// `{split}-images.idx3-ubyte` names, each raw or with `.gz`. Errors when
    /// a file is missing (listing the names tried) or invalid.
    pub fn open(dir: impl AsRef<Path>, train: bool) -> Result<Self> {
        let dir = dir.as_ref();
        let split = if train { "train" } else { "t10k" };
        let images = find_file(dir, split, "images", "idx3")?;
        let labels = find_file(dir, split, "labels", "idx1")?;
        Self::from_files(&images, &labels)
    }

    /// The number of classes of MNIST and Fashion-MNIST: labels lie in `0 .. 10`.
    pub const NUM_CLASSES: u8 = 10;

    /// Reads an images file (u8, 3-d) and a labels file (u8, 1-d) of equal
    /// count. Errors, naming the file, when either is invalid, the counts
    /// differ, or a label is not below [`Mnist::NUM_CLASSES`].
    pub fn from_files(images: &Path, labels: &Path) -> Result<Self> {
        let im = read_idx(images)?;
        let lb = read_idx(labels)?;
        let (IdxData::U8(img), [n, rows, cols]) = (im.data, im.dims.as_slice()) else {
            return Err(Error::format(images, "expected a 3-d u8 IDX array of images"));
        };
        let (IdxData::U8(lab), [m]) = (lb.data, lb.dims.as_slice()) else {
            return Err(Error::format(labels, "expected a 1-d u8 IDX array of labels"));
        };
        if n != m {
            return Err(Error::format(
                labels,
                format!("{m} labels for {n} images in {}", images.display()),
            ));
        }
        if let Some((k, &bad)) = lab.iter().enumerate().find(|(_, &l)| l >= Self::NUM_CLASSES) {
            return Err(Error::corrupt(
                labels,
                k as u64,
                format!("label {bad} is outside 0..{}", Self::NUM_CLASSES),
            ));
        }
        Ok(Mnist {
            images: img,
            labels: lab,
            rows: *rows,
            cols: *cols,
        })
    }

    /// All images as a u8 tensor `[N, 1, rows, cols]`.
    pub fn images_tensor(&self) -> Result<Tensor> {
        Ok(Tensor::from_slice(
            &self.images,
            &[self.labels.len(), 1, self.rows, self.cols],
        )?)
    }

    /// All labels as an i64 tensor `[N]`.
    pub fn labels_tensor(&self) -> Result<Tensor> {
        let v: Vec<i64> = self.labels.iter().map(|&l| l as i64).collect();
        Ok(Tensor::from_vec(v, &[self.labels.len()])?)
    }

    /// The labels.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// All pixels, `N·rows·cols` bytes.
    pub fn pixels(&self) -> &[u8] {
        &self.images
    }
}

impl Dataset for Mnist {
    type Item = (Image, i64);
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn get(&self, index: usize) -> Result<(Image, i64)> {
        Error::check_index("Mnist::get", index, self.labels.len())?;
        let per = self.rows * self.cols;
        let px = self.images[index * per..(index + 1) * per].to_vec();
        Ok((
            Image::new(self.rows, self.cols, 1, px)?,
            self.labels[index] as i64,
        ))
    }
}

fn find_file(dir: &Path, split: &str, what: &str, kind: &str) -> Result<PathBuf> {
    let stems = [
        format!("{split}-{what}-{kind}-ubyte"),
        format!("{split}-{what}.{kind}-ubyte"),
    ];
    let mut tried = Vec::new();
    for stem in &stems {
        for ext in ["", ".gz"] {
            let p = dir.join(format!("{stem}{ext}"));
            if p.is_file() {
                return Ok(p);
            }
            tried.push(
                p.file_name()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            );
        }
    }
    Err(Error::io(
        dir,
        std::io::Error::new(std::io::ErrorKind::NotFound, format!("none of {tried:?} found")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_type_raw_and_gz() {
        let dir = tempfile::tempdir().unwrap();
        let arrays = [
            IdxData::U8(vec![1, 2, 255, 0, 7, 9]),
            IdxData::I8(vec![-1, 2, -128, 0, 7, 127]),
            IdxData::I16(vec![-300, 2, 32767, 0, 7, -1]),
            IdxData::I32(vec![-70000, 2, i32::MAX, 0, 7, -1]),
            IdxData::F32(vec![1.5, -2.0, 0.0, 1e-3, 7.0, 3.25]),
            IdxData::F64(vec![1.5, -2.0, 0.0, 1e-300, 7.0, 3.25]),
        ];
        for (k, data) in arrays.into_iter().enumerate() {
            let a = IdxArray {
                dims: vec![2, 3],
                data,
            };
            for gz in [false, true] {
                let p = dir.path().join(format!("a{k}{gz}"));
                write_idx(&p, &a, gz).unwrap();
                assert_eq!(read_idx(&p).unwrap(), a);
            }
            assert_eq!(a.to_tensor().unwrap().shape(), &[2, 3]);
        }
    }

    #[test]
    fn byte_oracle_and_errors_name_the_file() {
        // Spec §1.4 header: 00000803 count rows cols.
        let mut b = vec![0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2];
        b.extend_from_slice(&[5, 6, 7, 8]);
        let a = parse_idx(&b, Path::new("x")).unwrap();
        assert_eq!(a.dims, vec![2, 1, 2]);
        assert_eq!(a.data, IdxData::U8(vec![5, 6, 7, 8]));
        b.pop();
        let e = parse_idx(&b, Path::new("/d/imgs.idx")).unwrap_err().to_string();
        assert!(e.contains("/d/imgs.idx") && e.contains("need 20 bytes"), "{e}");
        assert!(parse_idx(&[0, 0, 0x42, 1, 0, 0, 0, 0], Path::new("x")).is_err());
        assert!(parse_idx(&[1, 2], Path::new("x")).is_err());
    }

    #[test]
    fn mnist_labels_outside_the_ten_classes_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join("train-images-idx3-ubyte");
        let labels = dir.path().join("train-labels-idx1-ubyte");
        let im = IdxArray {
            dims: vec![3, 2, 2],
            data: IdxData::U8(vec![0; 12]),
        };
        write_idx(&images, &im, false).unwrap();
        for (bad, at) in [(200u8, 1), (10, 2)] {
            let mut v = vec![3u8, 9, 0];
            v[at] = bad;
            write_idx(
                &labels,
                &IdxArray {
                    dims: vec![3],
                    data: IdxData::U8(v),
                },
                true,
            )
            .unwrap();
            let e = Mnist::open(dir.path(), true).unwrap_err().to_string();
            assert!(
                e.contains("train-labels-idx1-ubyte")
                    && e.contains(&format!("label {bad}"))
                    && e.contains(&format!("{at}")),
                "{e}"
            );
        }
        let ok = IdxArray {
            dims: vec![3],
            data: IdxData::U8(vec![3, 9, 0]),
        };
        write_idx(&labels, &ok, false).unwrap();
        assert_eq!(Mnist::open(dir.path(), true).unwrap().labels(), &[3, 9, 0]);
    }
}
