//! The integration tests of tessera-autograd: one test binary per crate (the crate
//! graph is linked once), one module per topic. A test that needs
//! process-global state of its own (the live-byte counter, a global
//! allocator) is a separate file in `tests/` that says why in its first line.

mod attention;
mod device;
mod errors;
mod fused;
mod gradcheck;
mod ops;
mod parity;
mod profile;
