//! # tessera
//!
//! A deep learning framework written in Rust from the tensor up. This facade
//! re-exports the member crates; [`prelude`] brings the everyday names in,
//! and [`Error`] is the one error type every crate's error converts into.

pub use tessera_autograd as autograd;
pub use tessera_data as data;

/// Neural-network modules (`tessera-nn`). `#[derive(Module)]` here
/// generates code that names this facade (`::tessera::nn`), so a program
/// depending only on `tessera` can derive modules.
pub mod nn {
    pub use tessera_nn::*;
    // Shadows the glob's derive (macro namespace only; the `Module` trait
    // comes from the glob).
    pub use tessera_derive::FacadeModule as Module;
}
pub use tessera_optim as optim;
pub use tessera_parallel as parallel;
pub use tessera_tensor as tensor;

mod error;
pub mod prelude;

pub use error::{Error, Result};
pub use tessera_tensor::profile::{profile, Profile};
