//! The error type every fallible tensor operation returns.

/// An error from a tensor operation. Every variant names the operation (`op`)
/// and carries a message with the offending shapes or values, so a failure far
/// from its cause still says what went wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit the operation (rank, sizes, broadcasting, element counts).
    #[error("{op}: shape error: {msg}")]
    Shape {
        /// The operation that failed.
        op: &'static str,
        /// What was wrong, with the shapes involved.
        msg: String,
    },
    /// A dtype the operation does not accept, or two dtypes that do not match.
    #[error("{op}: dtype error: {msg}")]
    DType {
        /// The operation that failed.
        op: &'static str,
        /// What was wrong, with the dtypes involved.
        msg: String,
    },
    /// Operands on different devices, or a device that is not available.
    #[error("{op}: device error: {msg}")]
    Device {
        /// The operation that failed.
        op: &'static str,
        /// What was wrong, with the devices involved.
        msg: String,
    },
    /// A dimension or element index outside its range.
    #[error("{op}: index error: {msg}")]
    Index {
        /// The operation that failed.
        op: &'static str,
        /// The index and the range it had to lie in.
        msg: String,
    },
    /// An argument value outside its domain (a negative size, a zero step, p < 0, ...).
    #[error("{op}: invalid argument: {msg}")]
    Arg {
        /// The operation that failed.
        op: &'static str,
        /// The argument and why it is invalid.
        msg: String,
    },
    /// Memory for the result could not be allocated (an absurd size, or
    /// the machine is out of memory); the process carries on.
    #[error("{op}: out of memory: {msg}")]
    OutOfMemory {
        /// The operation that failed.
        op: &'static str,
        /// The shape, dtype and bytes that could not be allocated.
        msg: String,
    },
    /// Reading or writing a file failed, or its contents are corrupt.
    #[error("{op}: io error: {msg}")]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The file and the underlying error.
        msg: String,
    },
}

/// `Result` with the tensor [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A [`Error::Shape`] for `op`.
    pub fn shape(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Shape { op, msg: msg.into() }
    }
    /// A [`Error::DType`] for `op`.
    pub fn dtype(op: &'static str, msg: impl Into<String>) -> Self {
        Error::DType { op, msg: msg.into() }
    }
    /// A [`Error::Device`] for `op`.
    pub fn device(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Device { op, msg: msg.into() }
    }
    /// A [`Error::Index`] for `op`.
    pub fn index(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Index { op, msg: msg.into() }
    }
    /// A [`Error::Arg`] for `op`.
    pub fn arg(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Arg { op, msg: msg.into() }
    }
    /// A [`Error::OutOfMemory`] for `op`.
    pub fn out_of_memory(op: &'static str, msg: impl Into<String>) -> Self {
        Error::OutOfMemory { op, msg: msg.into() }
    }
    /// A [`Error::Io`] for `op`.
    pub fn io(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Io { op, msg: msg.into() }
    }
    /// The name of the operation that failed.
    pub fn op(&self) -> &'static str {
        match self {
            Error::Shape { op, .. }
            | Error::DType { op, .. }
            | Error::Device { op, .. }
            | Error::Index { op, .. }
            | Error::Arg { op, .. }
            | Error::OutOfMemory { op, .. }
            | Error::Io { op, .. } => op,
        }
    }
}
