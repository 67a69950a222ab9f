use super::*;
use crate::test_util::{layouts_of, rand_f64, values_f64};

/// A fresh path in the temp dir, removed when dropped.
struct TempPath(std::path::PathBuf);

impl TempPath {
    fn new(tag: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        TempPath(
            std::env::temp_dir().join(format!("tessera-st-{}-{tag}-{k}.safetensors", std::process::id())),
        )
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        std::fs::remove_file(&self.0).ok();
    }
}

fn all_dtypes_sample(shape: &[usize], seed: u64) -> Vec<(String, Tensor)> {
    let n: usize = shape.iter().product();
    // Values every dtype holds exactly: multiples of 1/4 in [-8, 8), and
    // non-negative integers for the unsigned dtypes.
    let vals: Vec<f64> = rand_f64(seed, n)
        .iter()
        .map(|x| (x * 32.0).floor() / 4.0)
        .collect();
    let uvals: Vec<f64> = vals.iter().map(|x| (x * 4.0).abs()).collect();
    let bools: Vec<f64> = vals.iter().map(|&x| (x > 0.0) as u8 as f64).collect();
    DType::ALL
        .iter()
        .map(|&dt| {
            let v = match dt {
                DType::U8 | DType::U32 | DType::I64 => &uvals,
                DType::Bool => &bools,
                _ => &vals,
            };
            let t = crate::with_dtype!(dt, T => crate::test_util::tensor_of::<T>(v, shape));
            (format!("{dt}"), t)
        })
        .collect()
}

#[test]
fn round_trip_every_dtype_and_layout() {
    for shape in [vec![3, 4], vec![2, 3, 5], vec![], vec![0, 3], vec![7]] {
        let p = TempPath::new("rt");
        let originals = all_dtypes_sample(&shape, shape.len() as u64);
        // Store each tensor through every layout layouts_of makes.
        let mut stored = Vec::new();
        for (name, t) in &originals {
            let v = values_f64(t);
            let views = crate::with_dtype!(t.dtype(), T => layouts_of::<T>(&v, &shape));
            for (k, view) in views.into_iter().enumerate() {
                stored.push((format!("{name}.{k}"), view));
            }
        }
        save(&p.0, stored.iter().map(|(n, t)| (n.as_str(), t))).unwrap();
        let loaded = load(&p.0).unwrap();
        assert_eq!(loaded.len(), stored.len());
        for (name, t) in &stored {
            let l = &loaded[name];
            assert_eq!((l.shape(), l.dtype()), (t.shape(), t.dtype()), "{name}");
            assert_eq!(values_f64(l), values_f64(t), "{name} {shape:?}");
            if l.numel() > 0 {
                assert!(l.storage().is_mapped(), "{name} should be memory-mapped");
            }
        }
    }
}

#[test]
fn metadata_round_trips_and_maps_save_too() {
    let p = TempPath::new("meta");
    let mut tensors = HashMap::new();
    tensors.insert("a".to_string(), Tensor::eye(3, None, DType::F16).unwrap());
    tensors.insert("b.weight".to_string(), Tensor::scalar(7i64));
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    save_with_metadata(&p.0, &tensors, &meta).unwrap();
    let (loaded, got_meta) = load_with_metadata(&p.0).unwrap();
    assert_eq!(got_meta, meta);
    assert_eq!(values_f64(&loaded["a"]), values_f64(&tensors["a"]));
    assert_eq!(loaded["b.weight"].to_scalar::<i64>().unwrap(), 7);
    save(&p.0, &tensors).unwrap();
    assert!(load_with_metadata(&p.0).unwrap().1.is_empty());
}

#[test]
fn saving_over_a_loaded_file_keeps_its_tensors() {
    let p = TempPath::new("over");
    let a = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    save(&p.0, [("x", &a)]).unwrap();
    let before = load(&p.0).unwrap();
    let b = Tensor::from_vec(vec![5.0f32, 6.0, 7.0], &[3]).unwrap();
    save(&p.0, [("x", &b)]).unwrap();
    assert_eq!(before["x"].to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    assert_eq!(
        load(&p.0).unwrap()["x"].to_vec::<f32>().unwrap(),
        vec![5.0, 6.0, 7.0]
    );
}

/// A file with a hand-written header: `tensors` are (json entry, bytes).
fn handmade(p: &TempPath, header: &str, data: &[u8]) {
    let mut h = header.as_bytes().to_vec();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend(h);
    bytes.extend(data);
    std::fs::write(&p.0, bytes).unwrap();
}

#[test]
fn misaligned_data_is_copied() {
    let p = TempPath::new("misaligned");
    let mut data = vec![9u8];
    data.extend(bytemuck::cast_slice::<f32, u8>(&[1.5, -2.0]));
    handmade(
        &p,
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}}"#,
        &data,
    );
    let t = load(&p.0).unwrap();
    assert_eq!(t["a"].to_vec::<u8>().unwrap(), vec![9]);
    assert_eq!(t["b"].to_vec::<f32>().unwrap(), vec![1.5, -2.0]);
    assert!(!t["b"].storage().is_mapped());
}

#[test]
fn corrupt_files_are_errors_naming_the_file() {
    let p = TempPath::new("corrupt");
    let name = p.0.display().to_string();
    let expect_err = |what: &str| {
        let e = load(&p.0).expect_err(what);
        assert!(e.to_string().contains(&name), "{what}: {e}");
    };
    let t = Tensor::arange(0.0, 12.0, 1.0, DType::F32).unwrap();
    save(&p.0, [("t", &t)]).unwrap();
    let good = std::fs::read(&p.0).unwrap();

    std::fs::write(&p.0, &good[..good.len() - 3]).unwrap();
    expect_err("truncated data");
    std::fs::write(&p.0, &good[..20]).unwrap();
    expect_err("truncated header");
    std::fs::write(&p.0, &good[..5]).unwrap();
    expect_err("truncated length");
    std::fs::write(&p.0, b"").unwrap();
    expect_err("empty file");
    let mut bad = good.clone();
    bad[8] = b'#';
    std::fs::write(&p.0, &bad).unwrap();
    expect_err("corrupted header");
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&p.0, &huge).unwrap();
    expect_err("header length too large");
    handmade(
        &p,
        r#"{"a":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}}"#,
        &[1, 2],
    );
    expect_err("unsupported dtype");
    handmade(
        &p,
        r#"{"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}"#,
        &[1, 2],
    );
    expect_err("bool byte 2");
    handmade(
        &p,
        r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
        &[0; 8],
    );
    expect_err("offsets do not match the shape");
    std::fs::remove_file(&p.0).unwrap();
    expect_err("missing file");
}

#[test]
fn random_corruption_never_panics() {
    let p = TempPath::new("fuzz");
    let t = Tensor::arange(0.0, 6.0, 1.0, DType::F64)
        .unwrap()
        .reshape([2, 3])
        .unwrap();
    let b = Tensor::from_vec(vec![true, false], &[2]).unwrap();
    save(&p.0, [("t", &t), ("b", &b)]).unwrap();
    let good = std::fs::read(&p.0).unwrap();
    let noise = rand_f64(99, 3 * 400);
    for k in 0..400 {
        let mut bad = good.clone();
        let pos = ((noise[3 * k] + 1.0) / 2.0 * bad.len() as f64) as usize % bad.len();
        bad[pos] = ((noise[3 * k + 1] + 1.0) * 128.0) as u8;
        let cut = ((noise[3 * k + 2] + 1.0) / 2.0 * bad.len() as f64) as usize;
        if k % 4 == 0 {
            bad.truncate(cut);
        }
        std::fs::write(&p.0, &bad).unwrap();
        // Ok (a flipped data byte) or Err; never a panic.
        if let Ok(m) = load(&p.0) {
            for v in m.values() {
                let _ = values_f64(v);
            }
        }
    }
}

#[test]
fn invalid_saves_are_errors() {
    let p = TempPath::new("badsave");
    let a = Tensor::scalar(1.0f32);
    assert!(save(&p.0, [("x", &a), ("x", &a)]).is_err());
    assert!(save(&p.0, [("__metadata__", &a)]).is_err());
    let dir = std::env::temp_dir()
        .join("tessera-no-such-dir")
        .join("f.safetensors");
    let e = save(&dir, [("x", &a)]).unwrap_err();
    assert!(e.to_string().contains("tessera-no-such-dir"), "{e}");
}

#[test]
fn loading_a_directory_says_so() {
    let dir = std::env::temp_dir().join(format!("tessera-dir-{}.safetensors", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = load(&dir).unwrap_err().to_string();
    let _ = std::fs::remove_dir(&dir);
    assert!(
        e.contains(&dir.display().to_string()) && e.contains("is a directory"),
        "{e}"
    );
}

#[test]
fn equal_metadata_saves_equal_bytes() {
    let t = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    let pairs: Vec<(String, String)> = (0..32).map(|i| (format!("key{i}"), format!("v\"{i}"))).collect();
    // Each map has its own hash seed, so their iteration orders differ.
    let saves: Vec<Vec<u8>> = (0..4)
        .map(|_| serialize([("t", &t)], pairs.iter().cloned().collect()).unwrap())
        .collect();
    assert!(
        saves.windows(2).all(|w| w[0] == w[1]),
        "saves of equal states differ"
    );
    let p = TempPath::new("sorted_meta");
    std::fs::write(&p.0, &saves[0]).unwrap();
    let (_, meta) = load_with_metadata(&p.0).unwrap();
    assert_eq!(meta, pairs.into_iter().collect::<HashMap<_, _>>());
}
