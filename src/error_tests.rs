use std::error::Error as _;
use std::io;
use std::path::{Path, PathBuf};

use super::{Error, Result};

/// `?` on each crate's error inside one function returning the facade's
/// `Result`.
fn each_crate(which: usize) -> Result<()> {
    match which {
        0 => {
            tessera_tensor::Tensor::zeros(&[2, 3], tessera_tensor::DType::F32)?.reshape([4])?;
        }
        1 => {
            tessera_data::formats::Mnist::open("/nonexistent/tessera-mnist", true)?;
        }
        2 => Err(tessera_parallel::CommError::arg("all_reduce", "bad rank 9"))?,
        3 => {
            std::fs::read("/nonexistent/tessera-file")?;
        }
        _ => return Err(Error::msg(format!("no case {which}"))),
    }
    Ok(())
}

#[test]
fn every_crate_error_converts_with_question_mark() {
    let e = each_crate(0).unwrap_err();
    assert!(matches!(&e, Error::Tensor(t) if t.op() == "reshape"), "{e:?}");
    assert!(e.to_string().contains("[2, 3]"), "{e}");

    match each_crate(1).unwrap_err() {
        Error::Io { source, path } => {
            assert_eq!(source.kind(), io::ErrorKind::NotFound);
            let path = path.expect("the data crate knows the file");
            assert!(path.starts_with("/nonexistent/tessera-mnist"), "{path:?}");
        }
        e => panic!("expected Io, got {e:?}"),
    }

    let e = each_crate(2).unwrap_err();
    assert!(matches!(e, Error::Comm(_)), "{e:?}");
    assert!(e.to_string().contains("bad rank 9"), "{e}");

    match each_crate(3).unwrap_err() {
        Error::Io { source, path: None } => assert_eq!(source.kind(), io::ErrorKind::NotFound),
        e => panic!("expected Io without a path, got {e:?}"),
    }

    assert_eq!(each_crate(4).unwrap_err().to_string(), "no case 4");
}

#[test]
fn io_errors_keep_their_source_and_path() {
    let e = Error::io(
        "/data/train.bin",
        io::Error::new(io::ErrorKind::UnexpectedEof, "cut short"),
    );
    assert_eq!(e.to_string(), "/data/train.bin: cut short");
    let source = e.source().expect("the io error is the source");
    assert_eq!(source.to_string(), "cut short");
    assert!(matches!(&e, Error::Io { path: Some(p), .. } if p == Path::new("/data/train.bin")));

    let bare = Error::from(io::Error::other("disk on fire"));
    assert_eq!(bare.to_string(), "disk on fire");
    assert!(bare.source().is_some());
}

#[test]
fn data_errors_other_than_io_stay_data_errors() {
    let e = Error::from(tessera_data::Error::format(PathBuf::from("x.shard"), "bad magic"));
    assert!(matches!(e, Error::Data(_)), "{e:?}");
    assert_eq!(e.to_string(), "x.shard: bad magic");
    let t = tessera_tensor::Error::shape("cat", "ranks differ");
    let e = Error::from(tessera_data::Error::Tensor(t.clone()));
    assert!(matches!(e, Error::Tensor(ref inner) if *inner == t), "{e:?}");
}
