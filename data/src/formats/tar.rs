//! A minimal streaming tar reader (POSIX ustar, pax `path`/`size`
//! overrides, GNU `L` long names; optionally gzip-compressed) and a ustar
//! writer with pax long names, for WebDataset-style shards.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

const BLOCK: usize = 512;

/// A regular file read from a tar archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TarEntry {
    /// The path inside the archive (after pax / GNU long-name overrides).
    pub name: String,
    /// The contents.
    pub data: Vec<u8>,
}

/// Streams the regular files of a tar archive in archive order; directories,
/// links and other entry types are skipped, pax global headers ignored. The
/// archive must end with its two zero blocks: a file cut short, even at an
/// entry boundary, ends the stream with an error rather than passing for a
/// shorter archive.
pub struct TarReader {
    path: PathBuf,
    input: Box<dyn Read + Send>,
    entry: u64,
    done: bool,
}

impl TarReader {
    /// Opens `path` (gzip-compressed when it starts with `1f 8b`). Errors
    /// when the file cannot be opened.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
        let mut buf = BufReader::with_capacity(1 << 16, file);
        let head = std::io::BufRead::fill_buf(&mut buf).map_err(|e| Error::io(&path, e))?;
        let input: Box<dyn Read + Send> = if head.starts_with(&[0x1f, 0x8b]) {
            Box::new(flate2::read::MultiGzDecoder::new(buf))
        } else {
            Box::new(buf)
        };
        Ok(TarReader {
            path,
            input,
            entry: 0,
            done: false,
        })
    }

    fn read_block(&mut self, what: &str) -> Result<Option<[u8; BLOCK]>> {
        let mut b = [0u8; BLOCK];
        let mut got = 0;
        while got < BLOCK {
            match self.input.read(&mut b[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(self.bad(format!("truncated {what}"))),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(&self.path, e)),
            }
        }
        Ok(Some(b))
    }

    fn read_data(&mut self, size: u64) -> Result<Vec<u8>> {
        let padded = size
            .div_ceil(BLOCK as u64)
            .checked_mul(BLOCK as u64)
            .filter(|_| usize::try_from(size).is_ok())
            .ok_or_else(|| self.bad(format!("entry size {size} is larger than any archive")))?;
        // Grow with the data actually read: a corrupt size must not reserve memory.
        let mut data = Vec::with_capacity(size.min(1 << 20) as usize);
        (&mut self.input)
            .take(padded)
            .read_to_end(&mut data)
            .map_err(|e| Error::io(&self.path, e))?;
        if (data.len() as u64) < padded {
            return Err(self.bad(format!(
                "truncated data: {} of {size} bytes",
                data.len().min(size as usize)
            )));
        }
        data.truncate(size as usize);
        Ok(data)
    }

    fn bad(&self, msg: String) -> Error {
        Error::corrupt(&self.path, self.entry, format!("tar entry: {msg}"))
    }

    fn next_entry(&mut self) -> Result<Option<TarEntry>> {
        let mut long_name: Option<String> = None;
        let mut pax: HashMap<String, String> = HashMap::new();
        loop {
            let Some(h) = self.read_block("header")? else {
                return Err(self
                    .bad("truncated archive: it ends without the two zero blocks that mark its end".into()));
            };
            if h.iter().all(|&b| b == 0) {
                return match self.read_block("end-of-archive marker")? {
                    Some(b) if b.iter().all(|&x| x == 0) => Ok(None),
                    Some(_) => Err(self.bad("a lone zero block inside the archive".into())),
                    None => Err(self.bad(
                        "truncated archive: the end-of-archive marker has one of its two zero blocks".into(),
                    )),
                };
            }
            let stored = parse_octal(&h[148..156]).ok_or_else(|| self.bad("bad checksum field".into()))?;
            let sum: u64 = h
                .iter()
                .enumerate()
                .map(|(i, &b)| if (148..156).contains(&i) { 32 } else { b as u64 })
                .sum();
            if stored != sum {
                return Err(self.bad(format!("header checksum {stored} does not match {sum}")));
            }
            let mut size = parse_size(&h[124..136]).ok_or_else(|| self.bad("bad size field".into()))?;
            if let Some(s) = pax.get("size") {
                size = s.parse().map_err(|_| self.bad(format!("bad pax size {s:?}")))?;
            }
            let kind = h[156];
            let data = self.read_data(size)?;
            match kind {
                b'x' => {
                    pax = parse_pax(&data).ok_or_else(|| self.bad("malformed pax header".into()))?;
                    continue;
                }
                b'L' => {
                    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
                    long_name = Some(String::from_utf8_lossy(&data[..end]).into_owned());
                    continue;
                }
                b'g' => continue,
                _ => {}
            }
            self.entry += 1;
            if kind != b'0' && kind != 0 {
                long_name = None;
                pax.clear();
                continue;
            }
            let name = match (pax.remove("path"), long_name.take()) {
                (Some(p), _) => p,
                (None, Some(l)) => l,
                (None, None) => {
                    let base = cstr(&h[..100]);
                    let prefix = if &h[257..262] == b"ustar" {
                        cstr(&h[345..500])
                    } else {
                        String::new()
                    };
                    if prefix.is_empty() {
                        base
                    } else {
                        format!("{prefix}/{base}")
                    }
                }
            };
            return Ok(Some(TarEntry { name, data }));
        }
    }
}

impl Iterator for TarReader {
    type Item = Result<TarEntry>;
    fn next(&mut self) -> Option<Result<TarEntry>> {
        if self.done {
            return None;
        }
        let r = self.next_entry().transpose();
        if !matches!(r, Some(Ok(_))) {
            self.done = true;
        }
        r
    }
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn parse_octal(b: &[u8]) -> Option<u64> {
    let s = cstr(b);
    let s = s.trim_matches(|c: char| c == ' ' || c == '\0');
    if s.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(s, 8).ok()
}

/// Octal, or GNU base-256 when the high bit of the first byte is set.
fn parse_size(b: &[u8]) -> Option<u64> {
    if b[0] & 0x80 != 0 {
        let mut v: u64 = (b[0] & 0x7f) as u64;
        for &x in &b[1..] {
            v = v.checked_mul(256)?.checked_add(x as u64)?;
        }
        Some(v)
    } else {
        parse_octal(b)
    }
}

/// Pax records `"<len> <key>=<value>\n"`.
fn parse_pax(mut d: &[u8]) -> Option<HashMap<String, String>> {
    let mut out = HashMap::new();
    while !d.is_empty() {
        let sp = d.iter().position(|&b| b == b' ')?;
        let len: usize = std::str::from_utf8(&d[..sp]).ok()?.parse().ok()?;
        if len <= sp + 1 || len > d.len() {
            return None;
        }
        let rec = &d[sp + 1..len - 1];
        let eq = rec.iter().position(|&b| b == b'=')?;
        out.insert(
            String::from_utf8_lossy(&rec[..eq]).into_owned(),
            String::from_utf8_lossy(&rec[eq + 1..]).into_owned(),
        );
        d = &d[len..];
    }
    Some(out)
}

/// Writes a ustar archive: regular files with mode 0444 and a fixed mtime
/// (reproducible output), long names through a pax `path` record.
pub struct TarWriter<W: Write> {
    out: W,
    mtime: u64,
}

impl<W: Write> TarWriter<W> {
    /// A writer into `out`, stamping every entry with `mtime` (seconds).
    pub fn new(out: W, mtime: u64) -> Self {
        TarWriter { out, mtime }
    }

    /// Appends the file `name` with `data`. Errors when writing fails.
    pub fn append(&mut self, name: &str, data: &[u8]) -> std::io::Result<()> {
        if name.len() > 100 {
            let mut rec = format!(" path={name}\n");
            // The length prefix counts itself: find the fixed point.
            let mut len = rec.len();
            while format!("{len}{rec}").len() != len {
                len = format!("{len}{rec}").len();
            }
            rec = format!("{len}{rec}");
            self.entry("././@PaxHeader", b'x', rec.as_bytes())?;
            let short: String = name
                .chars()
                .rev()
                .take(99)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            return self.entry(&short, b'0', data);
        }
        self.entry(name, b'0', data)
    }

    /// Writes the two zero blocks that end an archive and returns the output.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.out.write_all(&[0u8; 2 * BLOCK])?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn entry(&mut self, name: &str, kind: u8, data: &[u8]) -> std::io::Result<()> {
        let mut h = [0u8; BLOCK];
        let nb = name.as_bytes();
        h[..nb.len().min(100)].copy_from_slice(&nb[..nb.len().min(100)]);
        h[100..107].copy_from_slice(b"0000444");
        h[108..115].copy_from_slice(b"0000000");
        h[116..123].copy_from_slice(b"0000000");
        h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
        h[136..147].copy_from_slice(format!("{:011o}", self.mtime).as_bytes());
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| b as u64).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(data)?;
        let pad = (BLOCK - data.len() % BLOCK) % BLOCK;
        self.out.write_all(&vec![0u8; pad])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_long_names_gnu_and_gzip() {
        let dir = tempfile::tempdir().unwrap();
        let long = format!("{}/x.jpg", "d".repeat(150));
        let mut w = TarWriter::new(Vec::new(), 0);
        w.append("a.txt", b"hello").unwrap();
        w.append(&long, &[1u8; 1000]).unwrap();
        let mut bytes = w.finish().unwrap();
        // Prepend a GNU long-name entry by hand: type 'L' then a short-named file.
        let mut g = TarWriter::new(Vec::new(), 0);
        g.entry("././@LongLink", b'L', b"gnu/very/long/name.cls\0")
            .unwrap();
        g.entry("short", b'0', b"7").unwrap();
        g.entry("dir/", b'5', b"").unwrap();
        let mut all = g.out;
        all.append(&mut bytes);
        let p = dir.path().join("t.tar");
        std::fs::write(&p, &all).unwrap();
        let got: Vec<TarEntry> = TarReader::open(&p).unwrap().map(|e| e.unwrap()).collect();
        let names: Vec<&str> = got.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, vec!["gnu/very/long/name.cls", "a.txt", long.as_str()]);
        assert_eq!(got[1].data, b"hello");
        assert_eq!(got[2].data, vec![1u8; 1000]);

        let gz = dir.path().join("t.tar.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&all).unwrap();
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        assert_eq!(TarReader::open(&gz).unwrap().count(), 3);
    }

    #[test]
    fn corrupt_and_truncated_archives_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = TarWriter::new(Vec::new(), 0);
        w.append("a.txt", &[5u8; 700]).unwrap();
        w.append("b.txt", b"x").unwrap();
        let good = w.finish().unwrap();
        let p = dir.path().join("c.tar");
        let mut bad = good.clone();
        bad[BLOCK * 3 + 10] ^= 1; // b.txt's header
        std::fs::write(&p, &bad).unwrap();
        let r: Vec<_> = TarReader::open(&p).unwrap().collect();
        assert!(r[0].is_ok());
        let e = r[1].as_ref().unwrap_err().to_string();
        assert!(e.contains("c.tar") && e.contains("checksum"), "{e}");
        std::fs::write(&p, &good[..BLOCK + 100]).unwrap();
        let e = TarReader::open(&p)
            .unwrap()
            .next()
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
    }

    /// A four-sample archive (1, 700, 0 and 513 bytes of data).
    fn four_samples() -> Vec<u8> {
        let mut w = TarWriter::new(Vec::new(), 0);
        w.append("s0.cls", b"1").unwrap();
        w.append("s1.bin", &[7u8; 700]).unwrap();
        w.append("s2.txt", b"").unwrap();
        w.append("s3.bin", &[9u8; 513]).unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn archives_cut_at_any_block_boundary_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cut.tar");
        let good = four_samples();
        std::fs::write(&p, &good).unwrap();
        assert_eq!(
            TarReader::open(&p)
                .unwrap()
                .collect::<Result<Vec<_>>>()
                .unwrap()
                .len(),
            4
        );
        // Trailing zero padding after the end marker (tar's 10 KiB records) is fine.
        let mut padded = good.clone();
        padded.resize(10240, 0);
        std::fs::write(&p, &padded).unwrap();
        assert_eq!(
            TarReader::open(&p)
                .unwrap()
                .collect::<Result<Vec<_>>>()
                .unwrap()
                .len(),
            4
        );
        // Every cut before the second zero block, header boundaries
        // (0, 1536, 2560, 4096, ...) included, must be an error.
        for cut in (0..good.len()).step_by(BLOCK) {
            std::fs::write(&p, &good[..cut]).unwrap();
            let got: Vec<_> = TarReader::open(&p).unwrap().collect();
            let last = got.last().unwrap_or_else(|| panic!("cut at {cut}: no error"));
            let e = last.as_ref().map(|e| e.name.clone()).unwrap_err().to_string();
            assert!(
                e.contains("cut.tar") && e.contains("truncated"),
                "cut at {cut}: {e}"
            );
        }
    }

    #[test]
    fn pax_size_near_u64_max_is_an_error() {
        for size in [u64::MAX, u64::MAX - 100, u64::MAX / 2] {
            let mut w = TarWriter::new(Vec::new(), 0);
            // A pax record counts its own length: "<len> size=<size>\n".
            let body = format!(" size={size}\n");
            let mut len = body.len();
            while format!("{len}{body}").len() != len {
                len = format!("{len}{body}").len();
            }
            let rec = format!("{len}{body}");
            w.entry("././@PaxHeader", b'x', rec.as_bytes()).unwrap();
            w.entry("big.bin", b'0', b"abc").unwrap();
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("pax.tar");
            std::fs::write(&p, w.finish().unwrap()).unwrap();
            let got: Vec<_> = TarReader::open(&p).unwrap().collect();
            assert_eq!(got.len(), 1, "size {size}: {got:?}");
            let e = got[0].as_ref().unwrap_err().to_string();
            assert!(
                e.contains("pax.tar") && e.contains(&size.to_string()),
                "size {size}: {e}"
            );
        }
    }
}
