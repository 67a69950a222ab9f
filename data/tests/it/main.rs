//! The integration tests of tessera-data: one test binary per crate (linking the
//! crate graph once), one module per topic. A test that needs process-global
//! state of its own (a byte counter, a global allocator) is a separate file in
//! `tests/` that says why in its first line.

mod loader;
mod pipeline;
mod real_data;
mod sampler;
mod shard;
mod webdataset;
