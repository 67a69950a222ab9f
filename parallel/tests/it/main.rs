//! The integration tests of tessera-parallel, one module per topic, in one
//! test binary.

mod pipeline;
