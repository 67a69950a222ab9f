//! The crate's error type.

/// Everything a kernel launch, a compilation or the device context can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// libcuda could not be loaded (no driver installed).
    #[error("no CUDA driver found: {0}")]
    NoDriver(String),
    /// A driver is present but the device could not be opened.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// libnvrtc could not be loaded.
    #[error("NVRTC not found: {0}")]
    NoNvrtc(String),
    /// NVRTC rejected a kernel source; `log` is its compilation log.
    #[error("NVRTC failed to compile {module} for {arch}: {log}")]
    Compile {
        /// Kernel family that failed.
        module: &'static str,
        /// Target architecture, e.g. `sm_80`.
        arch: String,
        /// The NVRTC log.
        log: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error in {op}: {msg}")]
    Driver {
        /// What was being done.
        op: &'static str,
        /// The driver's message.
        msg: String,
    },
    /// The device could not hold an allocation of `bytes` bytes.
    #[error("out of memory on the CUDA device allocating {bytes} bytes: {msg}")]
    OutOfMemory {
        /// The size asked for.
        bytes: usize,
        /// The runtime's message.
        msg: String,
    },
    /// The CPU emulator of the device caught a fault the hardware would not
    /// report (or would report as a crash): a kernel writing outside its
    /// buffers, a divergent barrier, a deadlock, a copy outside any
    /// allocation, a launch whose arguments do not match the kernel.
    #[error("CUDA emulator, {op}: {msg}")]
    Emulator {
        /// What was being done (`launch`, `copy_htod`, ...).
        op: &'static str,
        /// What went wrong, with the kernel name and thread coordinates.
        msg: String,
    },
    /// A launch was given arguments that do not fit (shapes, lengths, sizes).
    #[error("{op}: {msg}")]
    Arg {
        /// The kernel wrapper that rejected its arguments.
        op: &'static str,
        /// What is wrong, with the offending values.
        msg: String,
    },
}

impl Error {
    /// Shorthand for [`Error::Arg`].
    pub fn arg(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Arg { op, msg: msg.into() }
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
