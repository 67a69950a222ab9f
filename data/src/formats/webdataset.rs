//! WebDataset-style tar shards: files grouped into samples by key, shards
//! shuffled per epoch and split by rank then by worker, samples shuffled
//! through a bounded buffer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::png::decode_png;
use super::tar::{TarEntry, TarReader};
use crate::{Error, Image, IterableDataset, Result, Rng, SampleIter, WorkerInfo};

/// One sample: the files of a shard that share a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TarSample {
    /// The key: the path up to the first `.` of the file name.
    pub key: String,
    /// The shard the sample came from.
    pub url: String,
    /// Contents by extension (everything after that `.`, lowercased).
    pub files: BTreeMap<String, Vec<u8>>,
}

impl TarSample {
    /// The image of the sample: its `png` file decoded (see
    /// [`super::png::decode_png`]). Errors naming the shard and the key when
    /// the sample has no `png` file or it does not decode.
    pub fn image(&self) -> Result<Image> {
        let bytes = self.file("png")?;
        decode_png(bytes, Path::new(&format!("{}:{}.png", self.url, self.key)))
    }

    /// The class label of the sample: its `cls` file, an ASCII integer as
    /// WebDataset writes it (surrounding whitespace allowed). Errors naming
    /// the shard and the key when the file is missing or not an integer.
    pub fn class(&self) -> Result<i64> {
        let bytes = self.file("cls")?;
        std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| Error::Format {
                path: PathBuf::from(&self.url),
                msg: format!(
                    "sample {}: cls is not an integer: {:?}",
                    self.key,
                    String::from_utf8_lossy(&bytes[..bytes.len().min(32)])
                ),
            })
    }

    fn file(&self, ext: &str) -> Result<&[u8]> {
        self.files
            .get(ext)
            .map(Vec::as_slice)
            .ok_or_else(|| Error::Format {
                path: PathBuf::from(&self.url),
                msg: format!(
                    "sample {} has no .{ext} file (it has: {})",
                    self.key,
                    self.files.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            })
    }
}

/// Splits a tar path into `(key, extension)` as WebDataset's
/// `^((?:.*/|)[^.]+)[.]([^/]*)$` does: the key runs to the first `.` of the
/// file name (`a/b.seg.png` → `a/b`, `seg.png`); the extension is
/// lowercased. `None` when the file name has no `.` or starts with one.
pub fn split_key(path: &str) -> Option<(&str, String)> {
    let base_start = path.rfind('/').map_or(0, |i| i + 1);
    let dot = path[base_start..].find('.')? + base_start;
    if dot == base_start {
        return None;
    }
    Some((&path[..dot], path[dot + 1..].to_lowercase()))
}

/// Groups consecutive tar entries with the same key into samples
/// (WebDataset's `group_by_keys`). Entries without a key and top-level
/// `__*__` metadata files are skipped; a repeated extension inside one
/// sample is an error naming the shard and the key.
pub struct GroupByKey<I> {
    entries: I,
    url: String,
    current: Option<TarSample>,
    done: bool,
}

impl<I: Iterator<Item = Result<TarEntry>>> GroupByKey<I> {
    /// Groups `entries`, read from shard `url`.
    pub fn new(entries: I, url: impl Into<String>) -> Self {
        GroupByKey {
            entries,
            url: url.into(),
            current: None,
            done: false,
        }
    }
}

impl<I: Iterator<Item = Result<TarEntry>>> Iterator for GroupByKey<I> {
    type Item = Result<TarSample>;

    fn next(&mut self) -> Option<Result<TarSample>> {
        while !self.done {
            let entry = match self.entries.next() {
                None => {
                    self.done = true;
                    break;
                }
                Some(Err(e)) => {
                    // The sample being gathered may be missing files: the
                    // error ends the stream, nothing follows it.
                    self.done = true;
                    self.current = None;
                    return Some(Err(e));
                }
                Some(Ok(e)) => e,
            };
            if !entry.name.contains('/') && entry.name.starts_with("__") && entry.name.ends_with("__") {
                continue;
            }
            let Some((key, ext)) = split_key(&entry.name) else {
                continue;
            };
            let same = self.current.as_ref().is_some_and(|c| c.key == key);
            let finished = if same { None } else { self.current.take() };
            let cur = self.current.get_or_insert_with(|| TarSample {
                key: key.to_string(),
                url: self.url.clone(),
                files: BTreeMap::new(),
            });
            if cur.files.contains_key(&ext) {
                self.done = true;
                return Some(Err(Error::format(
                    &self.url,
                    format!("sample {:?} has two files with extension {ext:?}", cur.key),
                )));
            }
            cur.files.insert(ext, entry.data);
            if let Some(s) = finished {
                return Some(Ok(s));
            }
        }
        self.current.take().map(Ok)
    }
}

/// WebDataset's buffer shuffle (`_shuffle(bufsize, initial)`): fill a buffer
/// (taking up to two samples per step while it is below `bufsize`); once it
/// holds `initial`, emit a uniformly chosen element (swap-remove); at the
/// end drain it randomly.
pub struct BufferShuffle<I: Iterator> {
    inner: I,
    buf: Vec<I::Item>,
    bufsize: usize,
    initial: usize,
    rng: Rng,
    exhausted: bool,
}

impl<I: Iterator> BufferShuffle<I> {
    /// Shuffles `inner` through a buffer of `bufsize` items, starting to
    /// emit at `initial` (clamped to `bufsize`).
    pub fn new(inner: I, bufsize: usize, initial: usize, rng: Rng) -> Self {
        BufferShuffle {
            inner,
            buf: Vec::with_capacity(bufsize),
            bufsize,
            initial: initial.min(bufsize),
            rng,
            exhausted: false,
        }
    }

    fn pick(&mut self) -> Option<I::Item> {
        if self.buf.is_empty() {
            return None;
        }
        let k = self.rng.below(self.buf.len() as u64) as usize;
        Some(self.buf.swap_remove(k))
    }
}

impl<I: Iterator> Iterator for BufferShuffle<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        while !self.exhausted {
            match self.inner.next() {
                None => self.exhausted = true,
                Some(x) => {
                    self.buf.push(x);
                    if self.buf.len() < self.bufsize {
                        match self.inner.next() {
                            Some(y) => self.buf.push(y),
                            None => self.exhausted = true,
                        }
                    }
                    if self.buf.len() >= self.initial {
                        return self.pick();
                    }
                }
            }
        }
        self.pick()
    }
}

/// A list of tar shards read as an [`IterableDataset`] of [`TarSample`]s.
///
/// Per epoch `e`: the shard list is shuffled with a generator keyed by
/// `(seed, e)` (identical on every rank and worker, so the splits stay
/// disjoint; unlike WebDataset's split-then-shuffle this also moves shards
/// between ranks across epochs), then split by rank (`list[rank::world]`),
/// then by worker (`[worker::num_workers]`); each shard is streamed and
/// grouped by key, and, with a buffer, the samples are shuffled with a
/// generator keyed by `(seed, e, rank·1000 + worker)` (WebDataset's
/// per-worker seed). With fewer shards than `world·workers` some workers get
/// none: use at least that many shards.
#[derive(Debug, Clone)]
pub struct TarShards {
    urls: Vec<PathBuf>,
    rank: usize,
    world_size: usize,
    shuffle_shards: bool,
    buffer: Option<(usize, usize)>,
    seed: u64,
}

impl TarShards {
    /// The shards at `urls`, single node, in list order, no buffer shuffle.
    pub fn new(urls: Vec<PathBuf>) -> Self {
        TarShards {
            urls,
            rank: 0,
            world_size: 1,
            shuffle_shards: false,
            buffer: None,
            seed: 0,
        }
    }

    /// Reads only this rank's shards; errors when `rank >= world_size`.
    pub fn split_by_node(mut self, rank: usize, world_size: usize) -> Result<Self> {
        if rank >= world_size {
            return Err(Error::arg(
                "TarShards::split_by_node",
                format!("rank {rank} is not below world size {world_size}"),
            ));
        }
        self.rank = rank;
        self.world_size = world_size;
        Ok(self)
    }

    /// Shuffles the shard list each epoch.
    pub fn shuffle_shards(mut self, on: bool) -> Self {
        self.shuffle_shards = on;
        self
    }

    /// Shuffles samples through a buffer (`bufsize`, `initial`: WebDataset
    /// uses 1000 and 100).
    pub fn shuffle_buffer(mut self, bufsize: usize, initial: usize) -> Self {
        self.buffer = (bufsize > 1).then_some((bufsize, initial));
        self
    }

    /// The seed of both shuffles (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The shards worker `worker` reads in `epoch`, in order.
    pub fn shards_for(&self, epoch: u64, worker: WorkerInfo) -> Vec<PathBuf> {
        let mut urls = self.urls.clone();
        if self.shuffle_shards {
            Rng::keyed(self.seed, &[epoch]).shuffle(&mut urls);
        }
        urls.into_iter()
            .skip(self.rank)
            .step_by(self.world_size.max(1))
            .skip(worker.id)
            .step_by(worker.num_workers.max(1))
            .collect()
    }
}

impl IterableDataset for TarShards {
    type Item = TarSample;

    fn iter(&self, epoch: u64, worker: WorkerInfo) -> SampleIter<'_, TarSample> {
        let samples =
            self.shards_for(epoch, worker)
                .into_iter()
                .flat_map(|p| -> SampleIter<'static, TarSample> {
                    match TarReader::open(&p) {
                        Ok(r) => Box::new(GroupByKey::new(r, p.display().to_string())),
                        Err(e) => Box::new(std::iter::once(Err(e))),
                    }
                });
        match self.buffer {
            None => Box::new(samples),
            Some((size, initial)) => {
                let stream = (self.rank * 1000 + worker.id) as u64;
                let rng = Rng::keyed(self.seed, &[epoch, stream]);
                Box::new(BufferShuffle::new(samples, size, initial, rng))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::TarWriter;

    #[test]
    fn key_split_follows_the_webdataset_regex() {
        assert_eq!(split_key("a/b.seg.PNG"), Some(("a/b", "seg.png".to_string())));
        assert_eq!(split_key("x.y/z.cls"), Some(("x.y/z", "cls".to_string())));
        assert_eq!(split_key("noext"), None);
        assert_eq!(split_key("d/.hidden"), None);
        assert_eq!(split_key("k."), Some(("k", String::new())));
    }

    fn entries(names: &[&str]) -> Vec<Result<TarEntry>> {
        names
            .iter()
            .map(|n| {
                Ok(TarEntry {
                    name: n.to_string(),
                    data: n.as_bytes().to_vec(),
                })
            })
            .collect()
    }

    #[test]
    fn grouping_edge_cases() {
        let g: Vec<TarSample> = GroupByKey::new(
            entries(&[
                "__meta__",
                "a.jpg",
                "a.cls",
                "a.seg.png",
                "README",
                "b.jpg",
                "a.txt",
            ])
            .into_iter(),
            "s0",
        )
        .map(|r| r.unwrap())
        .collect();
        let keys: Vec<(&str, Vec<&str>)> = g
            .iter()
            .map(|s| (s.key.as_str(), s.files.keys().map(String::as_str).collect()))
            .collect();
        // A key reappearing later starts a new sample (samples must be contiguous).
        assert_eq!(
            keys,
            vec![
                ("a", vec!["cls", "jpg", "seg.png"]),
                ("b", vec!["jpg"]),
                ("a", vec!["txt"])
            ]
        );
        let dup: Vec<_> = GroupByKey::new(entries(&["a.jpg", "a.JPG"]).into_iter(), "s1.tar").collect();
        let e = dup[0].as_ref().unwrap_err().to_string();
        assert!(e.contains("s1.tar") && e.contains("\"jpg\""), "{e}");
    }

    #[test]
    fn buffer_shuffle_is_a_permutation_and_seeded() {
        let run = |seed| BufferShuffle::new(0..500, 50, 10, Rng::new(seed)).collect::<Vec<_>>();
        let a = run(1);
        assert_eq!(a, run(1));
        assert_ne!(a, run(2));
        assert_ne!(a, (0..500).collect::<Vec<_>>());
        let mut s = a.clone();
        s.sort_unstable();
        assert_eq!(s, (0..500).collect::<Vec<_>>());
        // A bounded buffer only moves items a bounded distance forward.
        assert!(a.iter().enumerate().all(|(pos, &v)| v <= 2 * pos + 50));
    }

    #[test]
    fn shard_split_by_rank_then_worker() {
        let urls: Vec<PathBuf> = (0..12).map(|k| PathBuf::from(format!("s{k}"))).collect();
        let w = |id| WorkerInfo { id, num_workers: 2 };
        let r1 = TarShards::new(urls.clone()).split_by_node(1, 3).unwrap();
        // rank 1 of 3 owns s1 s4 s7 s10; worker 1 of 2 takes s4 s10.
        assert_eq!(
            r1.shards_for(0, w(1)),
            vec![PathBuf::from("s4"), PathBuf::from("s10")]
        );
        let mut all = Vec::new();
        for rank in 0..3 {
            let t = TarShards::new(urls.clone())
                .split_by_node(rank, 3)
                .unwrap()
                .shuffle_shards(true)
                .seed(4);
            for id in 0..2 {
                all.extend(t.shards_for(5, w(id)));
            }
        }
        all.sort();
        let mut want = urls.clone();
        want.sort();
        assert_eq!(all, want, "each shard exactly once per epoch");
        let t = TarShards::new(urls).shuffle_shards(true);
        assert_ne!(
            t.shards_for(0, WorkerInfo::SINGLE),
            t.shards_for(1, WorkerInfo::SINGLE)
        );
    }

    /// A sample's `png` and `cls` read back through a real tar shard; a
    /// missing file, a non-integer class and a corrupt image are errors
    /// naming the shard and the key.
    #[test]
    fn samples_give_their_png_image_and_cls_label() {
        let mut png_bytes = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut png_bytes, 2, 2);
            enc.set_color(png::ColorType::Grayscale);
            let mut wr = enc.write_header().unwrap();
            wr.write_image_data(&[0, 85, 170, 255]).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train-000.tar");
        let mut tar = TarWriter::new(std::fs::File::create(&path).unwrap(), 0);
        tar.append("d/0001.png", &png_bytes).unwrap();
        tar.append("d/0001.cls", b" 7\n").unwrap();
        tar.append("d/0002.png", &png_bytes[..png_bytes.len() / 2])
            .unwrap();
        tar.append("d/0002.cls", b"seven").unwrap();
        tar.append("d/0003.jpg", b"...").unwrap();
        tar.finish().unwrap();
        let samples: Vec<TarSample> = GroupByKey::new(TarReader::open(&path).unwrap(), "train-000.tar")
            .collect::<Result<_>>()
            .unwrap();
        let im = samples[0].image().unwrap();
        assert_eq!((im.shape(), im.data()), ([2, 2, 1], &[0u8, 85, 170, 255][..]));
        assert_eq!(samples[0].class().unwrap(), 7);
        for (e, what) in [
            (samples[1].image().unwrap_err(), "PNG"),
            (samples[1].class().unwrap_err(), "not an integer"),
            (samples[2].image().unwrap_err(), "no .png file (it has: jpg)"),
        ] {
            let e = e.to_string();
            assert!(
                e.contains("train-000.tar") && e.contains("d/000") && e.contains(what),
                "{e}"
            );
        }
    }
}
