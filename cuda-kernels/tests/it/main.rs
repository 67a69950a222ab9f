//! The integration tests of tessera-cuda-kernels: one test binary per crate (linking the
//! crate graph once), one module per topic. A test that needs process-global
//! state of its own (a byte counter, a global allocator) is a separate file in
//! `tests/` that says why in its first line.

mod common;
mod emu;
mod emu_faults;
mod gpu;
mod nvrtc;
mod wrappers;
