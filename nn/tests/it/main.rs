//! The integration tests of tessera-nn: one test binary per crate (the crate
//! graph is linked once), one module per topic. A test that needs
//! process-global state of its own (the live-byte counter, a global
//! allocator) is a separate file in `tests/` that says why in its first line.

mod autocast;
mod init_stats;
mod mha_fused;
mod models;
// Moves to and from `Device::Cuda`, which exists with the `cuda` feature.
#[cfg(feature = "cuda")]
mod module_to;
mod state_dict;
mod timm_layers;
mod timm_parity;
mod torch_parity;
