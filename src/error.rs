//! [`Error`]: the one error type a script needs. Every member crate's error
//! converts into it, so `?` works across crates in a function returning
//! [`Result`].

use std::fmt;
use std::path::PathBuf;

/// Any tessera failure, for programs that call several crates and want one
/// error type (`fn main() -> tessera::Result<()>`). Each member crate's
/// error converts into it through `From`, so `?` just works; the original
/// error stays reachable through the variant and [`std::error::Error::source`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor, autograd, nn or optim operation failed (they share the
    /// tensor crate's error, which names the op and the values involved).
    #[error(transparent)]
    Tensor(#[from] tessera_tensor::Error),
    /// A dataset, reader, transform or loader failed (its I/O failures
    /// arrive as [`Error::Io`] instead, with their path).
    #[error(transparent)]
    Data(tessera_data::Error),
    /// A communicator, collective or launcher call failed.
    #[error(transparent)]
    Comm(#[from] tessera_parallel::CommError),
    /// A CUDA kernel, its compilation or the device context failed.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] tessera_cuda_kernels::Error),
    /// An operating-system I/O error, with the file it concerned when that
    /// is known.
    #[error("{}", IoMessage { path: path.as_ref(), source })]
    Io {
        /// The underlying error.
        source: std::io::Error,
        /// The file or directory involved, when known.
        path: Option<PathBuf>,
    },
    /// A failure of the calling program itself, from [`Error::msg`].
    #[error("{0}")]
    Msg(String),
}

/// `Result` with the facade [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Io`] for `path`: `std::fs::read(&p).map_err(|e| Error::io(&p, e))?`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            source,
            path: Some(path.into()),
        }
    }

    /// An [`Error::Msg`] carrying `msg`, for a script's own failures
    /// (`return Err(Error::msg("no checkpoint found"))`).
    pub fn msg(msg: impl fmt::Display) -> Self {
        Error::Msg(msg.to_string())
    }
}

/// An I/O error without a path (`?` on `std::fs` calls); use [`Error::io`]
/// to attach one.
impl From<std::io::Error> for Error {
    fn from(source: std::io::Error) -> Self {
        Error::Io { source, path: None }
    }
}

/// A data error; its I/O failures become [`Error::Io`] with their path, so
/// one `match` arm handles every file error.
impl From<tessera_data::Error> for Error {
    fn from(e: tessera_data::Error) -> Self {
        match e {
            tessera_data::Error::Io { path, source } => Error::Io {
                source,
                path: Some(path),
            },
            tessera_data::Error::Tensor(e) => Error::Tensor(e),
            e => Error::Data(e),
        }
    }
}

/// `path: source`, or just `source` without a path.
struct IoMessage<'a> {
    path: Option<&'a PathBuf>,
    source: &'a std::io::Error,
}

impl fmt::Display for IoMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path {
            Some(p) => write!(f, "{}: {}", p.display(), self.source),
            None => write!(f, "{}", self.source),
        }
    }
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;
