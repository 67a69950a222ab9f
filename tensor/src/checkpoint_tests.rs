use std::path::{Path, PathBuf};

use super::*;
use crate::{DType, Generator, Tensor};

/// A fresh directory in the temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("tessera-ckpt-{}-{tag}", std::process::id()));
        std::fs::remove_dir_all(&d).ok();
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn sample() -> Checkpoint {
    let mut model = StateDict::new();
    model.insert("fc.weight", Tensor::arange(0.0, 6.0, 1.0, DType::F32).unwrap());
    model.insert("bn.num_batches_tracked", Tensor::scalar(3i64));
    let mut opt = StateDict::new();
    opt.set("kind", "AdamW");
    opt.insert("state.0.exp_avg", Tensor::full(&[6], 0.5, DType::F32).unwrap());
    let mut sched = StateDict::new();
    sched.set("last_epoch", 12u64);
    Checkpoint::new(model)
        .at(2, 12)
        .with_optimizer(opt)
        .with_scheduler(sched)
        .with_rng("data", Generator::new(9).state())
        .with_meta("run", "baseline")
}

fn save(dir: &Path) -> PathBuf {
    let path = dir.join("last.safetensors");
    sample().save(&path).unwrap();
    path
}

#[test]
fn round_trip_keeps_every_part() {
    let dir = TempDir::new("round");
    let back = Checkpoint::load(save(&dir.0)).unwrap();
    let want = sample();
    assert_eq!((back.epoch, back.step), (2, 12));
    assert_eq!(
        back.model.keys().collect::<Vec<_>>(),
        ["fc.weight", "bn.num_batches_tracked"]
    );
    assert_eq!(
        back.model
            .require("t", "fc.weight")
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        want.model
            .require("t", "fc.weight")
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    );
    assert_eq!(
        back.optimizer().unwrap().get::<String>("t", "kind").unwrap(),
        "AdamW"
    );
    assert_eq!(
        back.scheduler().unwrap().get::<u64>("t", "last_epoch").unwrap(),
        12
    );
    assert!(back.scaler().is_err(), "no scaler was saved");
    assert_eq!(back.rng, want.rng);
    assert_eq!(back.meta::<String>("run").unwrap(), "baseline");
    assert!(back.meta::<u64>("run").is_err());
}

#[test]
fn restoring_the_rng_replays_the_same_draws() {
    crate::manual_seed(5);
    let ckpt = Checkpoint::new(StateDict::new());
    let a = Tensor::randn(&[8], DType::F32).unwrap().to_vec::<f32>().unwrap();
    ckpt.restore_default_rng().unwrap();
    let b = Tensor::randn(&[8], DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, b);
}

#[test]
fn every_flipped_byte_is_an_error_naming_the_file() {
    let dir = TempDir::new("flip");
    let path = save(&dir.0);
    let good = std::fs::read(&path).unwrap();
    // Every byte of a small file: header, CRC field, tensor data.
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x01;
        std::fs::write(&path, &bad).unwrap();
        let e = Checkpoint::load(&path).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("last.safetensors"), "byte {i}: {e}");
    }
}

#[test]
fn truncated_file_is_an_error_naming_the_file() {
    let dir = TempDir::new("trunc");
    let path = save(&dir.0);
    let good = std::fs::read(&path).unwrap();
    for len in [0, 4, 8, 20, good.len() / 2, good.len() - 1] {
        std::fs::write(&path, &good[..len]).unwrap();
        let e = Checkpoint::load(&path).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("last.safetensors"), "{len} bytes: {e}");
    }
    let e = Checkpoint::load(dir.0.join("absent"))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("absent"), "{e}");
    let e = Checkpoint::load(&dir.0).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("directory"), "{e}");
}

#[test]
fn plain_safetensors_file_is_not_a_checkpoint() {
    let dir = TempDir::new("plain");
    let path = dir.0.join("w.safetensors");
    crate::safetensors::save(&path, [("w", &Tensor::scalar(1.0f32))]).unwrap();
    let e = Checkpoint::load(&path).map(|_| ()).unwrap_err().to_string();
    assert!(
        e.contains("w.safetensors") && e.contains("not a tessera checkpoint"),
        "{e}"
    );
}

#[test]
fn stray_temp_files_of_a_dead_save_are_removed_and_live_ones_kept() {
    let dir = TempDir::new("stray");
    // A process that has exited: its pid names the temp file of a save it
    // never finished.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stray = dir.0.join(format!(".last.safetensors.tmp-{dead}-0"));
    // This process's id but no save running: a stray of an earlier process
    // that had the same id.
    let reused = dir
        .0
        .join(format!(".last.safetensors.tmp-{}-999999", std::process::id()));
    // Not a name the writer makes, and another target's temp file: kept.
    let other = dir.0.join(".last.safetensors.tmp-notes");
    let other_target = dir.0.join(format!(".other.safetensors.tmp-{dead}-0"));
    for p in [&stray, &reused, &other, &other_target] {
        std::fs::write(p, b"partial").unwrap();
    }
    save(&dir.0);
    assert!(!stray.exists() && !reused.exists());
    assert!(other.exists() && other_target.exists());
    let names: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
}

#[cfg(unix)]
#[test]
fn file_mode_follows_the_umask_and_a_save_replaces_the_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("mode");
    let path = save(&dir.0);
    // A file created the ordinary way gets 0o666 minus the umask.
    let plain = dir.0.join("plain");
    std::fs::write(&plain, b"").unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), mode(&plain));
    let ckpt = sample().at(3, 18);
    ckpt.save(&path).unwrap();
    assert_eq!(Checkpoint::load(&path).unwrap().epoch, 3);
}

#[test]
fn save_failure_leaves_the_old_file_and_no_temp() {
    let dir = TempDir::new("fail");
    let path = save(&dir.0);
    let before = std::fs::read(&path).unwrap();
    let e = sample()
        .save(dir.0.join("missing-dir").join("x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing-dir"), "{e}");
    // Saving over a directory fails without touching it.
    let sub = dir.0.join("sub");
    std::fs::create_dir(&sub).unwrap();
    assert!(sample().save(&sub).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 2);
}
