//! A full augmentation pipeline through the loader: per-epoch image size
//! (progressive resizing) and identical batches for any worker count.

use tessera_data::transforms::{
    normalize, random_crop, random_hflip, random_resized_crop, Padding, ProgressiveResize, RandAugment,
};
use tessera_data::{Array, DataLoader, Dataset, Image, VecDataset};

fn images(n: usize) -> VecDataset<(Image, i64)> {
    VecDataset::new(
        (0..n)
            .map(|i| {
                let px = (0..32 * 40 * 3).map(|k| ((k * 13 + i * 7) % 256) as u8).collect();
                (Image::new(32, 40, 3, px).unwrap(), (i % 10) as i64)
            })
            .collect(),
    )
}

#[test]
fn progressive_resizing_changes_the_batch_shape_by_epoch() {
    let sched = ProgressiveResize::new(64, 128, 1, 3).unwrap();
    let ds = images(8).map_random(1, move |(img, y), ctx| {
        let r = sched.resolution(ctx.epoch);
        Ok((
            random_resized_crop(&img, r, r, (0.35, 1.0), (0.75, 4.0 / 3.0), &mut ctx.rng)?,
            y,
        ))
    });
    let mut l = DataLoader::builder(ds)
        .batch_size(4)
        .num_workers(2)
        .build()
        .unwrap();
    for (epoch, side) in [(0, 64), (1, 64), (2, 96), (3, 128)] {
        l.set_epoch(epoch);
        for b in l.iter() {
            assert_eq!(b.unwrap().0.shape(), &[4, side, side, 3]);
        }
    }
}

#[test]
fn augmented_batches_identical_for_any_worker_count() {
    let pipeline = |workers| {
        let ra = RandAugment::new(2, 9.0).unwrap();
        let ds = images(20).map_random(7, move |(img, y), ctx| {
            let img = random_crop(&img, 32, 40, 4, Padding::Reflect, &mut ctx.rng)?;
            let img = random_hflip(img, 0.5, &mut ctx.rng);
            let img = ra.apply(&img, &mut ctx.rng);
            let x: Array<f32> = normalize(&img, &[0.4914, 0.4822, 0.4465], &[0.2470, 0.2435, 0.2616])?;
            Ok((x, y))
        });
        let mut b = DataLoader::builder(ds)
            .batch_size(6)
            .shuffle(true)
            .seed(3)
            .num_workers(workers);
        if workers > 0 {
            b = b.prefetch_factor(1);
        }
        let mut l = b.build().unwrap();
        l.set_epoch(2);
        l.iter()
            .map(|b| {
                let (x, y) = b.unwrap();
                assert_eq!(x.shape()[1..], [3, 32, 40]);
                (x.to_vec::<f32>().unwrap(), y.to_vec::<i64>().unwrap())
            })
            .collect::<Vec<_>>()
    };
    let base = pipeline(0);
    assert_eq!(base.len(), 4);
    assert_eq!(base, pipeline(1));
    assert_eq!(base, pipeline(3));
}
