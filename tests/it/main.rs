//! The integration tests of the tessera facade (whole-stack tests): one test
//! binary per crate (linking the crate graph once), one module per topic. A
//! test that needs process-global state of its own (a byte counter, a global
//! allocator) is a separate file in `tests/` that says why in its first line.

mod checkpoint_resume;
mod concurrent_training;
mod cuda_training;
mod custom_module_example;
mod mnist_mlp_e2e;
mod prelude;
mod train_ddp;
mod train_example;
mod train_gpt_example;
mod train_mnist_example;
mod train_mnist_onebit;
mod train_mnist_pipeline;
mod train_mnist_precision;
mod train_mnist_resume;
mod train_mnist_zero;
