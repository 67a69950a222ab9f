//! The tensor crate's integration tests, one binary: a module per topic.

mod fuzz;
mod no_panic;
mod sizes;
