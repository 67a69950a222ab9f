//! # tessera
//!
//! A deep learning framework written in Rust from the tensor up. This facade
//! re-exports the member crates; [`prelude`] brings the everyday names in,
//! and [`Error`] is the one error type every crate's error converts into.

pub use tessera_autograd as autograd;
pub use tessera_data as data;
pub use tessera_nn as nn;
pub use tessera_optim as optim;
pub use tessera_parallel as parallel;
pub use tessera_tensor as tensor;

mod error;
pub mod prelude;

pub use error::{Error, Result};
