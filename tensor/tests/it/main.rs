//! The integration tests of tessera-tensor: one test binary per crate (the crate
//! graph is linked once), one module per topic. A test that needs
//! process-global state of its own (the live-byte counter, a global
//! allocator) is a separate file in `tests/` that says why in its first line.

mod casts;
mod cuda_attention;
mod cuda_backend;
mod cuda_nn_ops;
mod cuda_shape_ops;
mod cuda_train_ops;
mod fuzz;
mod no_panic;
mod safetensors_torch;
mod sizes;
