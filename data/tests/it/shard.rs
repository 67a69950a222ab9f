//! Record shards: round trip of every field type, the converter, and
//! corruption (flipped bytes, truncation) reported with file and record.

use proptest::prelude::*;
use tessera_data::formats::{write_shards, Field, FieldKind, ShardReader, ShardSet, ShardWriter, Value};
use tessera_data::{Array, DataLoader, Dataset, Error, Image, VecDataset};

fn schema() -> Vec<Field> {
    vec![
        Field::new("raw", FieldKind::Bytes),
        Field::new("image", FieldKind::ImageU8),
        Field::new("label", FieldKind::I64),
        Field::new("emb", FieldKind::F32Array),
        Field::new("id", FieldKind::I64),
    ]
}

fn sample(i: usize) -> Vec<Value> {
    let (h, w, c) = (1 + i % 5, 2 + i % 3, 1 + 2 * (i % 2));
    let px: Vec<u8> = (0..h * w * c).map(|k| (k * 7 + i) as u8).collect();
    let dims = vec![i % 3, 2];
    let n: usize = dims.iter().product();
    vec![
        Value::Bytes((0..i % 11).map(|k| k as u8 ^ 0x5a).collect()),
        Value::Image(Image::new(h, w, c, px).unwrap()),
        Value::I64(i as i64 * -1_000_000_007),
        Value::F32(Array::new(dims, (0..n).map(|k| k as f32 * 0.5 - i as f32).collect()).unwrap()),
        Value::I64(i64::MAX - i as i64),
    ]
}

fn write(dir: &std::path::Path, n: usize) -> std::path::PathBuf {
    let mut w = ShardWriter::create(dir.join("s.tshard"), &schema()).unwrap();
    for i in 0..n {
        w.append(&sample(i)).unwrap();
    }
    w.finish().unwrap()
}

#[test]
fn round_trip_every_field_type() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), 25);
    let r = ShardReader::open(&path).unwrap();
    assert_eq!(r.len(), 25);
    assert_eq!(r.schema(), schema().as_slice());
    for i in (0..25).rev() {
        let rec = r.get(i).unwrap();
        assert_eq!(rec.values(), sample(i).as_slice(), "record {i}");
        assert_eq!(rec.i64("label").unwrap(), i as i64 * -1_000_000_007);
        assert_eq!(r.inline_i64(i, 4).unwrap(), i64::MAX - i as i64);
    }
    assert!(r.get(25).is_err());
    assert!(r.inline_i64(0, 1).is_err());
    // Only the temporary files are gone: the directory holds the shard alone.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn empty_shard_and_schema_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), 0);
    assert_eq!(ShardReader::open(p).unwrap().len(), 0);
    assert!(ShardWriter::create(dir.path().join("x"), &[]).is_err());
    let dup = [Field::new("a", FieldKind::I64), Field::new("a", FieldKind::Bytes)];
    assert!(ShardWriter::create(dir.path().join("x"), &dup).is_err());
    let long = [Field::new("a".repeat(25), FieldKind::I64)];
    assert!(ShardWriter::create(dir.path().join("x"), &long).is_err());
    let mut w = ShardWriter::create(dir.path().join("y"), &schema()).unwrap();
    let mut bad = sample(0);
    bad.swap(0, 1);
    assert!(w.append(&bad).is_err());
    assert!(w.append(&sample(0)[..3]).is_err());
}

#[test]
fn converter_and_loader_over_shards() {
    let dir = tempfile::tempdir().unwrap();
    let items: Vec<(Image, i64)> = (0..10).map(|i| (Image::filled(4, 4, 1, i as u8), i)).collect();
    let fields = [
        Field::new("image", FieldKind::ImageU8),
        Field::new("label", FieldKind::I64),
    ];
    let paths = write_shards(
        &VecDataset::new(items),
        &fields,
        dir.path(),
        "train",
        4,
        |(im, l)| Ok(vec![Value::Image(im), Value::I64(l)]),
    )
    .unwrap();
    assert_eq!(paths.len(), 3);
    assert!(paths[2].ends_with("train-00002.tshard"));
    let set = ShardSet::open(&paths).unwrap();
    assert_eq!(set.len(), 10);
    let ds = set.map(|mut r| Ok((r.take_image("image")?, r.i64("label")?)));
    let mut l = DataLoader::builder(ds)
        .batch_size(3)
        .num_workers(2)
        .build()
        .unwrap();
    let mut labels = Vec::new();
    for b in l.iter() {
        let (x, y) = b.unwrap();
        let y = y.to_vec::<i64>().unwrap();
        let x = x.to_vec::<u8>().unwrap();
        for (k, &lab) in y.iter().enumerate() {
            assert!(x[k * 16..(k + 1) * 16].iter().all(|&p| p as i64 == lab));
        }
        labels.extend(y);
    }
    assert_eq!(labels, (0..10).collect::<Vec<_>>());
}

fn corrupt_message(path: &std::path::Path, index: usize) -> String {
    match ShardReader::open(path) {
        Err(e) => e.to_string(),
        Ok(r) => r.get(index).unwrap_err().to_string(),
    }
}

#[test]
fn flipped_payload_byte_is_detected_with_file_and_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), 6);
    let clean = std::fs::read(&path).unwrap();
    let r = ShardReader::open(&path).unwrap();
    let (payload, _) = r.raw(3).unwrap();
    let offset = payload.as_ptr() as usize - r.raw(0).unwrap().0.as_ptr() as usize;
    drop(r);
    // Record 0's payload starts at the header's payload offset (bytes 40..48).
    let payload_start = u64::from_le_bytes(clean[40..48].try_into().unwrap()) as usize;
    let mut bytes = clean.clone();
    bytes[payload_start + offset + 8] ^= 0x10; // the first byte of the `raw` field
    std::fs::write(&path, &bytes).unwrap();
    let r = ShardReader::open(&path).unwrap();
    assert!(r.get(2).is_ok() && r.get(4).is_ok());
    let e = r.get(3).unwrap_err();
    assert!(matches!(e, Error::Corrupt { record: 3, .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("s.tshard") && msg.contains("record 3") && msg.contains("checksum"),
        "{msg}"
    );
    // With checks off the flip goes unnoticed (it is the CRC that caught it).
    let unchecked = ShardReader::open(&path).unwrap().verify_checksums(false);
    assert!(unchecked.get(3).is_ok());
}

#[test]
fn header_index_and_truncation_damage_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), 6);
    let clean = std::fs::read(&path).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", clean[..clean.len() - 3].to_vec(), "truncated"),
        ("short header", clean[..40].to_vec(), "truncated"),
        (
            "magic",
            {
                let mut b = clean.clone();
                b[0] = b'X';
                b
            },
            "magic",
        ),
        (
            "field name",
            {
                let mut b = clean.clone();
                b[64 + 9] ^= 1;
                b
            },
            "header checksum",
        ),
        (
            "record count",
            {
                let mut b = clean.clone();
                b[16] ^= 1;
                b
            },
            "header checksum",
        ),
    ];
    for (what, bytes, want) in cases {
        std::fs::write(&path, &bytes).unwrap();
        let msg = corrupt_message(&path, 0);
        assert!(msg.contains("s.tshard") && msg.contains(want), "{what}: {msg}");
    }
    // An index row pointing past the end names its record.
    let index_offset = u64::from_le_bytes(clean[24..32].try_into().unwrap()) as usize;
    let row = u32::from_le_bytes(clean[32..36].try_into().unwrap()) as usize;
    let mut b = clean.clone();
    b[index_offset + 2 * row + 9] = 0xff; // record 2's length
    std::fs::write(&path, &b).unwrap();
    let msg = corrupt_message(&path, 2);
    assert!(
        msg.contains("record 2") && msg.contains("outside the payload"),
        "{msg}"
    );
    // An inline label flip fails that record's checksum.
    let mut b = clean;
    b[index_offset + 4 * row + 24] ^= 4;
    std::fs::write(&path, &b).unwrap();
    let msg = corrupt_message(&path, 4);
    assert!(msg.contains("record 4") && msg.contains("checksum"), "{msg}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn random_records_round_trip(
        recs in prop::collection::vec(
            (prop::collection::vec(any::<u8>(), 0..40), 0usize..4, 0usize..4, 1usize..4, any::<i64>(),
             prop::collection::vec(-1e6f32..1e6, 0..9)),
            0..12)
    ) {
        let dir = tempfile::tempdir().unwrap();
        let fields = [
            Field::new("b", FieldKind::Bytes), Field::new("i", FieldKind::ImageU8),
            Field::new("l", FieldKind::I64), Field::new("f", FieldKind::F32Array),
        ];
        let values: Vec<Vec<Value>> = recs.iter().map(|(b, h, w, c, l, f)| {
            let px = (0..h * w * c).map(|k| k as u8).collect();
            vec![
                Value::Bytes(b.clone()),
                Value::Image(Image::new(*h, *w, *c, px).unwrap()),
                Value::I64(*l),
                Value::F32(Array::new(vec![f.len()], f.clone()).unwrap()),
            ]
        }).collect();
        let mut wr = ShardWriter::create(dir.path().join("p.tshard"), &fields).unwrap();
        for v in &values {
            wr.append(v).unwrap();
        }
        let r = ShardReader::open(wr.finish().unwrap()).unwrap();
        prop_assert_eq!(r.len(), values.len());
        for (i, v) in values.iter().enumerate() {
            let rec = r.get(i).unwrap();
            prop_assert_eq!(rec.values(), v.as_slice());
        }
    }
}

#[test]
fn format_md_example_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let fields = [
        Field::new("image", FieldKind::ImageU8),
        Field::new("label", FieldKind::I64),
    ];
    let mut w = ShardWriter::create(dir.path().join("e.tshard"), &fields).unwrap();
    w.append(&[Value::Image(Image::filled(28, 28, 1, 9)), Value::I64(7)])
        .unwrap();
    let b = std::fs::read(w.finish().unwrap()).unwrap();
    assert_eq!(b.len(), 960);
    assert_eq!(&b[..8], b"TSRSHARD");
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    assert_eq!((u32_at(8), u32_at(12), u64_at(16)), (1, 2, 1));
    assert_eq!(
        (u64_at(24), u32_at(32), u64_at(40), u64_at(48)),
        (128, 32, 160, 960)
    );
    assert_eq!((b[64], &b[72..77], b[77]), (1, &b"image"[..], 0));
    assert_eq!((b[96], &b[104..109]), (2, &b"label"[..]));
    assert_eq!((u64_at(128), u64_at(136), u64_at(152)), (160, 796, 7));
    let mut h = crc32fast::Hasher::new();
    h.update(&b[160..956]);
    h.update(&7i64.to_le_bytes());
    assert_eq!(u32_at(144), h.finalize());
    assert_eq!((u32_at(160), u32_at(164), u32_at(168)), (28, 28, 1));
    assert!(b[172..956].iter().all(|&p| p == 9) && b[956..].iter().all(|&p| p == 0));
}
