//! Tar shards end to end: written with TarWriter, read through TarShards and
//! the IterableLoader with workers.

use std::path::PathBuf;

use tessera_data::formats::{TarShards, TarWriter};
use tessera_data::{IterableDataset, IterableLoader, WorkerInfo};

fn write_shards(dir: &std::path::Path, shards: usize, per: usize) -> Vec<PathBuf> {
    (0..shards)
        .map(|s| {
            let mut w = TarWriter::new(Vec::new(), 0);
            for k in 0..per {
                let id = s * per + k;
                w.append(&format!("sample{id:04}.cls"), id.to_string().as_bytes())
                    .unwrap();
                w.append(&format!("sample{id:04}.seg.png"), &[id as u8; 3])
                    .unwrap();
            }
            let p = dir.join(format!("shard-{s:03}.tar"));
            std::fs::write(&p, w.finish().unwrap()).unwrap();
            p
        })
        .collect()
}

fn ids(t: &TarShards, epoch: u64, worker: WorkerInfo) -> Vec<i64> {
    t.iter(epoch, worker)
        .map(|s| {
            let s = s.unwrap();
            assert_eq!(s.files["seg.png"].len(), 3);
            String::from_utf8(s.files["cls"].clone())
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

#[test]
fn every_sample_once_per_epoch_across_ranks_and_workers() {
    let dir = tempfile::tempdir().unwrap();
    let urls = write_shards(dir.path(), 8, 5);
    let mut epochs = Vec::new();
    for epoch in 0..2 {
        let mut all = Vec::new();
        for rank in 0..2 {
            let t = TarShards::new(urls.clone())
                .split_by_node(rank, 2)
                .unwrap()
                .shuffle_shards(true)
                .shuffle_buffer(10, 3)
                .seed(11);
            for id in 0..2 {
                all.extend(ids(&t, epoch, WorkerInfo { id, num_workers: 2 }));
            }
        }
        epochs.push(all.clone());
        all.sort_unstable();
        assert_eq!(all, (0..40).collect::<Vec<_>>());
    }
    assert_ne!(epochs[0], epochs[1]);
}

#[test]
fn loader_over_tar_shards_with_workers() {
    let dir = tempfile::tempdir().unwrap();
    let urls = write_shards(dir.path(), 4, 6);
    let ds = TarShards::new(urls).map(|s| {
        let v: i64 = String::from_utf8_lossy(&s.files["cls"])
            .parse()
            .map_err(|_| tessera_data::Error::arg("parse", format!("bad label in {}", s.key)))?;
        Ok(v)
    });
    let mut l = IterableLoader::builder(ds)
        .batch_size(4)
        .num_workers(2)
        .build()
        .unwrap();
    let batches: Vec<Vec<i64>> = l.iter().map(|b| b.unwrap().to_vec::<i64>().unwrap()).collect();
    // Worker 0 reads shards 0 and 2, worker 1 shards 1 and 3; batches alternate.
    assert_eq!(batches[0], vec![0, 1, 2, 3]);
    assert_eq!(batches[1], vec![6, 7, 8, 9]);
    let mut all = batches.concat();
    all.sort_unstable();
    assert_eq!(all, (0..24).collect::<Vec<_>>());
}

#[test]
fn missing_shard_is_an_error_naming_it() {
    let t = TarShards::new(vec![PathBuf::from("/nonexistent/shard-9.tar")]);
    let e = t
        .iter(0, WorkerInfo::SINGLE)
        .next()
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(e.contains("shard-9.tar"), "{e}");
}

#[test]
fn shard_cut_at_a_sample_boundary_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let urls = write_shards(dir.path(), 1, 4);
    let full = std::fs::read(&urls[0]).unwrap();
    // Each sample is two files of one data block: 2048 bytes per sample.
    for samples in 0..4 {
        std::fs::write(&urls[0], &full[..samples * 2048]).unwrap();
        let got: Vec<_> = TarShards::new(urls.clone()).iter(0, WorkerInfo::SINGLE).collect();
        let e = got
            .last()
            .and_then(|r| r.as_ref().err())
            .unwrap_or_else(|| panic!("cut after {samples} samples: read as a whole shard"))
            .to_string();
        assert!(e.contains("shard-000.tar") && e.contains("truncated"), "{e}");
    }
}
