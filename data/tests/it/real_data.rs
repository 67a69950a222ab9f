//! Readers on real files: the MNIST subset in `datasets/mnist` (always
//! present) and Fashion-MNIST from Debian's `dataset-fashion-mnist` package
//! (used when installed).

use std::path::{Path, PathBuf};

use tessera_data::formats::{Mnist, FASHION_MNIST_DIR};
use tessera_data::{DataLoader, Dataset};

fn mnist_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/mnist")
}

fn class_counts(labels: &[u8]) -> [usize; 10] {
    let mut c = [0; 10];
    for &l in labels {
        c[l as usize] += 1;
    }
    c
}

#[test]
fn mnist_subset_reads_with_sane_labels() {
    let train = Mnist::open(mnist_dir(), true).unwrap();
    let test = Mnist::open(mnist_dir(), false).unwrap();
    assert_eq!((train.len(), test.len()), (8000, 2000));
    for (ds, n) in [(&train, 8000), (&test, 2000)] {
        assert!(ds.labels().iter().all(|&l| l < 10));
        let counts = class_counts(ds.labels());
        // Roughly balanced: every digit between 6% and 14% of the split.
        for c in counts {
            assert!(c * 100 > 6 * n && c * 100 < 14 * n, "{counts:?}");
        }
        let mean = ds.pixels().iter().map(|&p| p as f64).sum::<f64>() / ds.pixels().len() as f64 / 255.0;
        assert!((mean - 0.1307).abs() < 0.01, "mean pixel {mean}");
    }
    let (img, label) = train.get(0).unwrap();
    assert_eq!(img.shape(), [28, 28, 1]);
    assert_eq!(label, train.labels()[0] as i64);
    assert_eq!(train.images_tensor().unwrap().shape(), &[8000, 1, 28, 28]);

    let mut l = DataLoader::builder(test).batch_size(512).build().unwrap();
    let shapes: Vec<Vec<usize>> = l.iter().map(|b| b.unwrap().0.shape().to_vec()).collect();
    assert_eq!(shapes.len(), 4);
    assert_eq!(shapes[3], vec![2000 - 3 * 512, 28, 28, 1]);
}

#[test]
fn fashion_mnist_when_installed() {
    let dir = Path::new(FASHION_MNIST_DIR);
    if !dir.join("train-labels-idx1-ubyte.gz").exists() {
        eprintln!(
            "skipped: Fashion-MNIST is not installed at {FASHION_MNIST_DIR} \
             (apt-get install dataset-fashion-mnist)"
        );
        return;
    }
    let train = Mnist::open(dir, true).unwrap();
    let test = Mnist::open(dir, false).unwrap();
    assert_eq!((train.len(), test.len()), (60_000, 10_000));
    assert_eq!(&train.labels()[..10], &[9, 0, 0, 3, 0, 2, 7, 2, 5, 5]);
    assert_eq!(class_counts(train.labels()), [6000; 10]);
    assert_eq!(class_counts(test.labels()), [1000; 10]);
    let mean = train.pixels().iter().map(|&p| p as f64).sum::<f64>() / train.pixels().len() as f64 / 255.0;
    assert!((mean - 0.2860).abs() < 5e-4, "mean pixel {mean}");
}
