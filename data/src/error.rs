//! The crate's error type: tensor errors, io errors and corrupt files, each
//! naming the file (and record) involved, plus failures inside loader workers.

use std::path::PathBuf;

/// An error from a dataset, a reader, a transform or the loader.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed (collate, a batched transform).
    #[error(transparent)]
    Tensor(#[from] tessera_tensor::Error),
    /// Opening, reading or writing `path` failed.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// `path` is not a valid file of the expected format (bad magic, header,
    /// checksum, truncated tables).
    #[error("{path}: {msg}")]
    Format {
        /// The file involved.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// Record `record` of `path` is corrupt (checksum mismatch, out-of-bounds
    /// offsets, truncated payload, fields that do not decode).
    #[error("{path}: record {record}: {msg}")]
    Corrupt {
        /// The file involved.
        path: PathBuf,
        /// The index of the record inside the file.
        record: u64,
        /// What is wrong with it.
        msg: String,
    },
    /// An argument outside its domain (a zero batch size, a rank ≥ world size, ...).
    #[error("{op}: invalid argument: {msg}")]
    Arg {
        /// The function that rejected it.
        op: &'static str,
        /// The argument and why it is invalid.
        msg: String,
    },
    /// A sample index outside the dataset.
    #[error("{op}: index {index} is out of range for a dataset of length {len}")]
    Index {
        /// The function that rejected it.
        op: &'static str,
        /// The requested index.
        index: usize,
        /// The dataset length.
        len: usize,
    },
    /// A user function (dataset, transform, collate) panicked while building
    /// batch `batch`; the panic was caught and turned into this error.
    #[error("panic while loading batch {batch}: {msg}")]
    Panic {
        /// The position of the batch in the epoch.
        batch: usize,
        /// The panic message.
        msg: String,
    },
    /// A loader worker thread stopped without delivering its batch.
    #[error("loader worker failed: {0}")]
    Worker(String),
    /// No worker delivered batch `batch` within the loader's timeout (a
    /// worker stuck in a dataset read, PyTorch's `DataLoader timed out`).
    #[error("loader timed out after {secs} s waiting for batch {batch}")]
    Timeout {
        /// The position of the batch in the epoch.
        batch: usize,
        /// The timeout, in seconds.
        secs: f64,
    },
}

/// `Result` with the data [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
    /// An [`Error::Format`] for `path`.
    pub fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Format {
            path: path.into(),
            msg: msg.into(),
        }
    }
    /// An [`Error::Corrupt`] for record `record` of `path`.
    pub fn corrupt(path: impl Into<PathBuf>, record: u64, msg: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.into(),
            record,
            msg: msg.into(),
        }
    }
    /// An [`Error::Arg`] for `op`.
    pub fn arg(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Arg { op, msg: msg.into() }
    }
    /// An [`Error::Index`] unless `index < len`.
    pub fn check_index(op: &'static str, index: usize, len: usize) -> Result<()> {
        if index < len {
            Ok(())
        } else {
            Err(Error::Index { op, index, len })
        }
    }
}
