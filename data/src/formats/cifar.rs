//! CIFAR-10 and CIFAR-100 binary files: fixed-size records of label byte(s)
//! followed by 3072 pixel bytes, planar R, G, B, each 32×32 row-major.

use std::path::{Path, PathBuf};

use crate::{Dataset, Error, Image, Result};

const PIXELS: usize = 3 * 32 * 32;

/// CIFAR-10 class names, by label.
pub const CIFAR10_CLASSES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];

/// CIFAR images with their labels. Samples are `(Image 32×32×3 HWC, label)`,
/// the label being the fine label for CIFAR-100.
#[derive(Debug, Clone)]
pub struct Cifar {
    /// N records of 3072 planar bytes.
    pixels: Vec<u8>,
    labels: Vec<i64>,
    coarse: Option<Vec<i64>>,
}

impl Cifar {
    /// CIFAR-10 from `dir` (or `dir/cifar-10-batches-bin`): `data_batch_1..5.bin`
    /// for `train`, else `test_batch.bin`. Errors name the missing or corrupt file.
    pub fn cifar10(dir: impl AsRef<Path>, train: bool) -> Result<Self> {
        let dir = subdir(dir.as_ref(), "cifar-10-batches-bin", "test_batch.bin");
        let files: Vec<PathBuf> = if train {
            (1..=5).map(|k| dir.join(format!("data_batch_{k}.bin"))).collect()
        } else {
            vec![dir.join("test_batch.bin")]
        };
        let mut out = Cifar {
            pixels: Vec::new(),
            labels: Vec::new(),
            coarse: None,
        };
        for f in &files {
            let bytes = std::fs::read(f).map_err(|e| Error::io(f, e))?;
            out.append(&bytes, f, false)?;
        }
        Ok(out)
    }

    /// CIFAR-100 from `dir` (or `dir/cifar-100-binary`): `train.bin` or `test.bin`.
    pub fn cifar100(dir: impl AsRef<Path>, train: bool) -> Result<Self> {
        let dir = subdir(dir.as_ref(), "cifar-100-binary", "test.bin");
        let f = dir.join(if train { "train.bin" } else { "test.bin" });
        let bytes = std::fs::read(&f).map_err(|e| Error::io(&f, e))?;
        Self::parse(&bytes, &f, true)
    }

    /// Decodes one binary file's bytes (`cifar100` selects 2 label bytes,
    /// coarse then fine); `path` names the source in errors. Errors when the
    /// file is empty, the length is not a whole number of records, or a
    /// label is out of range.
    pub fn parse(bytes: &[u8], path: &Path, cifar100: bool) -> Result<Self> {
        let mut out = Cifar {
            pixels: Vec::new(),
            labels: Vec::new(),
            coarse: cifar100.then(Vec::new),
        };
        out.append(bytes, path, cifar100)?;
        Ok(out)
    }

    fn append(&mut self, bytes: &[u8], path: &Path, cifar100: bool) -> Result<()> {
        let head = if cifar100 { 2 } else { 1 };
        let rec = head + PIXELS;
        if bytes.is_empty() {
            return Err(Error::format(path, "the file is empty: no records"));
        }
        if bytes.len() % rec != 0 {
            return Err(Error::format(
                path,
                format!(
                    "{} bytes is not a whole number of {rec}-byte records",
                    bytes.len()
                ),
            ));
        }
        for (k, r) in bytes.chunks_exact(rec).enumerate() {
            let (fine, max) = if cifar100 { (r[1], 100) } else { (r[0], 10) };
            if fine >= max || (cifar100 && r[0] >= 20) {
                return Err(Error::corrupt(
                    path,
                    k as u64,
                    format!("label bytes {:?} out of range", &r[..head]),
                ));
            }
            self.labels.push(fine as i64);
            if let Some(c) = &mut self.coarse {
                c.push(r[0] as i64);
            }
            self.pixels.extend_from_slice(&r[head..]);
        }
        Ok(())
    }

    /// The (fine) labels.
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }

    /// CIFAR-100's coarse (superclass) labels; `None` for CIFAR-10.
    pub fn coarse_labels(&self) -> Option<&[i64]> {
        self.coarse.as_deref()
    }

    /// Record `index`'s pixels in the file's planar CHW order.
    pub fn chw(&self, index: usize) -> Result<&[u8]> {
        Error::check_index("Cifar::chw", index, self.labels.len())?;
        Ok(&self.pixels[index * PIXELS..(index + 1) * PIXELS])
    }
}

impl Dataset for Cifar {
    type Item = (Image, i64);
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn get(&self, index: usize) -> Result<(Image, i64)> {
        Ok((Image::from_chw(32, 32, 3, self.chw(index)?)?, self.labels[index]))
    }
}

/// `dir/name` when it exists and `dir` itself does not hold `probe`.
fn subdir(dir: &Path, name: &str, probe: &str) -> PathBuf {
    let nested = dir.join(name);
    if !dir.join(probe).exists() && nested.is_dir() {
        nested
    } else {
        dir.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(label: &[u8], seed: u8) -> Vec<u8> {
        let mut r = label.to_vec();
        r.extend((0..PIXELS).map(|i| (i as u8).wrapping_mul(seed)));
        r
    }

    #[test]
    fn cifar10_records_decode_to_hwc() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("cifar-10-batches-bin");
        std::fs::create_dir(&nested).unwrap();
        let bytes: Vec<u8> = [record(&[3], 1), record(&[9], 7)].concat();
        assert_eq!(bytes.len(), 2 * 3073);
        std::fs::write(nested.join("test_batch.bin"), &bytes).unwrap();
        let c = Cifar::cifar10(dir.path(), false).unwrap();
        assert_eq!(c.len(), 2);
        let (img, label) = c.get(1).unwrap();
        assert_eq!(label, 9);
        // Green channel of pixel (0, 1) is planar byte 1024 + 1.
        assert_eq!(img.at(0, 1, 1), ((1024 + 1) as u8).wrapping_mul(7));
        assert_eq!(img.to_chw(), &bytes[3073 + 1..]);
        let e = Cifar::cifar10(dir.path(), true).unwrap_err().to_string();
        assert!(e.contains("data_batch_1.bin"), "{e}");
    }

    #[test]
    fn cifar100_labels_and_corruption() {
        let bytes: Vec<u8> = [record(&[19, 99], 3), record(&[0, 5], 1)].concat();
        let c = Cifar::parse(&bytes, Path::new("t.bin"), true).unwrap();
        assert_eq!(c.labels(), &[99, 5]);
        assert_eq!(c.coarse_labels().unwrap(), &[19, 0]);
        let bad: Vec<u8> = [record(&[1, 5], 1), record(&[20, 5], 1)].concat();
        let e = Cifar::parse(&bad, Path::new("t.bin"), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.bin: record 1"), "{e}");
        assert!(Cifar::parse(&bytes[..100], Path::new("t.bin"), true).is_err());
    }

    #[test]
    fn empty_cifar_files_are_errors() {
        for cifar100 in [false, true] {
            let e = Cifar::parse(&[], Path::new("empty.bin"), cifar100)
                .unwrap_err()
                .to_string();
            assert!(e.contains("empty.bin") && e.contains("empty"), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("test_batch.bin"), []).unwrap();
        let e = Cifar::cifar10(dir.path(), false).unwrap_err().to_string();
        assert!(e.contains("test_batch.bin"), "{e}");
    }
}
