//! The integration tests of tessera-parallel: one test binary per crate (the
//! crate graph is linked once), one module per topic. A test that needs
//! process-global state of its own (the live-byte counter, a global
//! allocator) is a separate file in `tests/` that says why in its first line.

mod common;
mod data_parallel;
mod env;
mod local_api;
mod local_collectives;
mod local_shm;
mod nccl;
mod onebit;
mod pipeline;
mod tensor_parallel;
mod tp_dropout;
