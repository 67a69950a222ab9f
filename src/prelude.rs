//! The names most programs need: `use tessera::prelude::*;`.

pub use tessera_tensor::{DType, Device, Error, Result, Tensor};
