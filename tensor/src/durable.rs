//! Replacing a file atomically and durably: a reader sees the old file or
//! the new one, never a mix, and after a crash or power loss the rename is
//! not undone.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::{Error, Result};

/// Writes `bytes` to `path`: to a temporary file in the same directory,
/// synced to disk, renamed over `path`, then the directory synced (so the
/// rename itself survives a power loss). The new file's mode follows the
/// umask, as any file the process creates. Temporary files left by an
/// earlier save of the same `path` that was killed are removed first.
///
/// Errors, naming `op` and the file, on any I/O failure; the temporary
/// file is removed and `path` is left as it was.
pub(crate) fn write(op: &'static str, path: &Path, bytes: &[u8]) -> Result<()> {
    let err = |what: &str, e: std::io::Error| Error::io(op, format!("{}: {what}: {e}", path.display()));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::io(op, format!("{}: not a file name", path.display())))?;
    if path.is_dir() {
        return Err(Error::io(op, format!("{}: is a directory", path.display())));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    remove_stray_temps(&dir, name);
    let tmp = dir.join(temp_name(name));
    in_flight(|set| set.insert(tmp.clone()));
    let written = (|| {
        // create_new: never follow or reuse a file someone else placed there.
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| err("cannot create the temporary file", e))?;
        f.write_all(bytes).map_err(|e| err("cannot write", e))?;
        f.sync_all().map_err(|e| err("cannot sync to disk", e))?;
        drop(f);
        fs::rename(&tmp, path).map_err(|e| err("cannot rename the temporary file over it", e))
    })();
    if written.is_err() {
        fs::remove_file(&tmp).ok();
    }
    in_flight(|set| set.remove(&tmp));
    written?;
    sync_dir(&dir).map_err(|e| err("cannot sync the directory", e))
}

/// The prefix of the temporary files of saves to `name`.
fn temp_prefix(name: &str) -> String {
    format!(".{name}.tmp-")
}

/// A temporary name unique within this process: `.{name}.tmp-{pid}-{k}`.
fn temp_name(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let k = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{}{}-{k}", temp_prefix(name), std::process::id())
}

/// Removes temporary files of earlier saves to `name` in `dir` whose
/// process is gone (a save killed between create and rename). Temporary
/// files of saves running in this process (on another thread) and, where
/// the OS tells, of live processes are left alone; a file with this
/// process's id that no save here is writing is a stray of an earlier
/// process that had the same id (containers reuse small ids). Failures are
/// ignored: a stray file costs only disk space.
fn remove_stray_temps(dir: &Path, name: &str) {
    let prefix = temp_prefix(name);
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(rest) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        // Only names this module writes, `{pid}-{k}`: another file that
        // merely starts with the prefix is not ours to remove.
        let Some((pid, k)) = rest.split_once('-') else {
            continue;
        };
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), k.parse::<u64>()) else {
            continue;
        };
        let ours = pid == std::process::id();
        if (ours && in_flight(|set| set.contains(&entry.path()))) || (!ours && process_alive(pid)) {
            continue;
        }
        fs::remove_file(entry.path()).ok();
    }
}

/// Runs `f` on the set of temporary files this process is writing.
fn in_flight<R>(f: impl FnOnce(&mut HashSet<PathBuf>) -> R) -> R {
    static SET: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    // The set is only inserted into and removed from: a panic elsewhere
    // while it was locked leaves it usable.
    let mut guard = SET.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(HashSet::new))
}

/// True when process `pid` exists (Linux: `/proc/<pid>`); false where the OS
/// does not tell, so strays are removed there.
fn process_alive(pid: u32) -> bool {
    cfg!(target_os = "linux") && Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    // Windows cannot open a directory as a file; its rename is durable
    // once the file's data is.
    Ok(())
}
