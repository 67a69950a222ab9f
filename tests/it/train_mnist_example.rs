//! The modules of `examples/train_mnist`, compiled once for the tests that
//! drive them (`train_mnist_resume`, `train_mnist_pipeline`,
//! `train_mnist_zero`).

#[allow(dead_code)]
#[path = "../../examples/train_mnist/cli.rs"]
pub mod cli;
#[path = "../../examples/common/mod.rs"]
pub mod common;
#[path = "../../examples/train_mnist/data_parallel.rs"]
pub mod data_parallel;
#[path = "../../examples/train_mnist/pipeline.rs"]
pub mod pipeline;
#[path = "../../examples/train_mnist/progress.rs"]
pub mod progress;
#[path = "../../examples/train_mnist/run.rs"]
pub mod run;
