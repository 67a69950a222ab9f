//! Loader throughput.
//!
//! - `loader_records`: samples/s reading 28×28 u8 records (+ an i64 label)
//!   from record shards with 0, 1 and 2 workers, beside the in-memory bound
//!   (the same samples held in a `VecDataset`, 0 workers) measured in the
//!   same run; the ratio line compares shards at 0 workers with that bound.
//! - `loader_slow_transform`: an artificial 1 ms per-sample transform (a
//!   sleep, i.e. latency such as I/O or a remote decode), 0 vs 2 workers.
//!
//! Each figure is steady state: one warm-up epoch, then whole epochs until
//! at least one second has passed. Lines: `bench\t<workload>\t<impl>\t<metric>\t<value>\t<unit>`.

use std::time::{Duration, Instant};

use tessera_data::formats::{write_shards, Field, FieldKind, ShardSet, Value};
use tessera_data::{Collate, DataLoader, Dataset, Image, Result, VecDataset};

const RECORDS: usize = 60_000;
const BATCH: usize = 256;

fn throughput<D>(dataset: D, workers: usize) -> f64
where
    D: Dataset + 'static,
    D::Item: Collate,
{
    let mut l = DataLoader::builder(dataset)
        .batch_size(BATCH)
        .shuffle(true)
        .num_workers(workers);
    if workers > 0 {
        l = l.persistent_workers(true);
    }
    let mut l = l.build().expect("loader");
    let n = l.dataset().len();
    let mut epoch = || {
        for b in l.iter() {
            std::hint::black_box(b.expect("batch"));
        }
    };
    epoch();
    let start = Instant::now();
    let mut epochs = 0;
    while epochs == 0 || start.elapsed() < Duration::from_secs(1) {
        epoch();
        epochs += 1;
    }
    (epochs * n) as f64 / start.elapsed().as_secs_f64()
}

fn line(workload: &str, imp: &str, metric: &str, value: f64, unit: &str) {
    println!("bench\t{workload}\t{imp}\t{metric}\t{value:.2}\t{unit}");
}

fn samples() -> Vec<(Image, i64)> {
    (0..RECORDS)
        .map(|i| {
            let px = (0..784).map(|k| ((k * 31 + i * 17) % 256) as u8).collect();
            (Image::new(28, 28, 1, px).expect("image"), (i % 10) as i64)
        })
        .collect()
}

fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("tessera-loader-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| tessera_data::Error::io(&dir, e))?;
    let fields = [
        Field::new("image", FieldKind::ImageU8),
        Field::new("label", FieldKind::I64),
    ];
    let data = samples();
    let paths = write_shards(
        &VecDataset::new(data.clone()),
        &fields,
        &dir,
        "mnistlike",
        10_000,
        |(im, y)| Ok(vec![Value::Image(im), Value::I64(y)]),
    )?;

    let bound = throughput(VecDataset::new(data), 0);
    line("loader_records", "in_memory_w0", "throughput", bound, "samples/s");
    let mut shard_w0 = 0.0;
    for workers in [0, 1, 2] {
        let ds = ShardSet::open(&paths)?.map(|mut r| Ok((r.take_image("image")?, r.i64("label")?)));
        let t = throughput(ds, workers);
        if workers == 0 {
            shard_w0 = t;
        }
        line(
            "loader_records",
            &format!("shard_w{workers}"),
            "throughput",
            t,
            "samples/s",
        );
    }
    line(
        "loader_records",
        "shard_w0/in_memory_w0",
        "ratio",
        shard_w0 / bound,
        "x",
    );
    std::fs::remove_dir_all(&dir).map_err(|e| tessera_data::Error::io(&dir, e))?;

    let slow = |workers| {
        let ds = VecDataset::new((0..500i64).collect()).map(|x| {
            std::thread::sleep(Duration::from_millis(1));
            Ok(x)
        });
        throughput(ds, workers)
    };
    let w0 = slow(0);
    let w2 = slow(2);
    line("loader_slow_transform", "w0", "throughput", w0, "samples/s");
    line("loader_slow_transform", "w2", "throughput", w2, "samples/s");
    line("loader_slow_transform", "w2/w0", "speedup", w2 / w0, "x");
    Ok(())
}
