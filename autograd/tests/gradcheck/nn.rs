//! Gradcheck cases of the nn-level ops (matmul, convolution, pooling,
//! indexing, losses, attention). Add entries as `name: ["op"] => check_fn;`
//! with `check_fn: fn(u32) -> Checked`.

cases! {}
