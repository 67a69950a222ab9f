//! The registry of differentiable ops: every op name this crate records.
//!
//! # How an op name gets registered
//!
//! Ops inside this crate record themselves with [`super::record_op`] /
//! [`super::record_op_multi`], which take an [`Op`] rather than a string.
//! An `Op` can only be made here, by the `registry!` blocks below, and each
//! block also lists its names in a slice that [`DIFFERENTIABLE_OPS`]
//! concatenates. So an op recorded anywhere in the crate is registered by
//! construction, and the gradcheck coverage test (`tests/it/gradcheck/`) walks
//! [`DIFFERENTIABLE_OPS`] and fails for any name without a gradcheck case.
//! The same test also fails when a checked graph contains a name that is not
//! registered (a stray `record("name", ..)` call inside the crate).
//!
//! The public [`crate::record`] / [`crate::record_multi`] stay open for ops
//! defined outside this crate (fused kernels in `nn`, user extensions): those
//! names are not part of this registry.
//!
//! Two blocks keep merges trivial: tensor-level ops (elementwise,
//! reductions, views, normalization) and nn-level ops (matmul, convolution,
//! pooling, indexing, losses, attention). Add a name to the block of its
//! family, as `CONST_NAME = "name",`.

/// The name of a registered differentiable op. Only this module can make
/// one, so every op recorded through [`super::record_op`] is in
/// [`DIFFERENTIABLE_OPS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Op(&'static str);

impl Op {
    /// The op's name, as it appears in [`DIFFERENTIABLE_OPS`] and in
    /// [`crate::GradcheckReport::ops`].
    pub const fn name(self) -> &'static str {
        self.0
    }
}

/// Defines one `pub const NAME: Op` per entry and a slice `$list` of their
/// names.
macro_rules! registry {
    ($list:ident: $($konst:ident = $name:literal,)*) => {
        $(
            #[doc = concat!("The registered op `", $name, "`.")]
            pub const $konst: Op = Op($name);
        )*
        const $list: &[&str] = &[$($name),*];
    };
}

registry! {TENSOR_OPS:
    // Elementwise unary.
    NEG = "neg",
    ABS = "abs",
    EXP = "exp",
    LOG = "log",
    LOG1P = "log1p",
    EXPM1 = "expm1",
    SQRT = "sqrt",
    RSQRT = "rsqrt",
    RECIP = "recip",
    SQUARE = "square",
    POW_SCALAR = "pow_scalar",
    RPOW_SCALAR = "rpow_scalar",
    SIN = "sin",
    COS = "cos",
    TANH = "tanh",
    SIGMOID = "sigmoid",
    RELU = "relu",
    GELU = "gelu",
    SILU = "silu",
    ERF = "erf",
    CLAMP = "clamp",
    TO_DTYPE = "to_dtype",
    // Elementwise binary and scalar forms.
    ADD = "add",
    SUB = "sub",
    MUL = "mul",
    DIV = "div",
    MAXIMUM = "maximum",
    MINIMUM = "minimum",
    POW = "pow",
    ADD_SCALAR = "add_scalar",
    SUB_SCALAR = "sub_scalar",
    RSUB_SCALAR = "rsub_scalar",
    MUL_SCALAR = "mul_scalar",
    DIV_SCALAR = "div_scalar",
    RDIV_SCALAR = "rdiv_scalar",
    WHERE = "where",
    // Reductions and scans.
    SUM = "sum",
    MEAN = "mean",
    MAX = "max",
    MIN = "min",
    PROD = "prod",
    VAR = "var",
    STD = "std",
    LOGSUMEXP = "logsumexp",
    NORM = "norm",
    SOFTMAX = "softmax",
    LOG_SOFTMAX = "log_softmax",
    CUMSUM = "cumsum",
    // Views.
    RESHAPE = "reshape",
    VIEW = "view",
    TRANSPOSE = "transpose",
    PERMUTE = "permute",
    NARROW = "narrow",
    SLICE = "slice",
    SELECT = "select",
    FLIP = "flip",
    EXPAND = "expand",
    SQUEEZE = "squeeze",
    UNSQUEEZE = "unsqueeze",
    CONTIGUOUS = "contiguous",
    // Normalization.
    LAYER_NORM = "layer_norm",
    BATCH_NORM = "batch_norm",
    GROUP_NORM = "group_norm",
    // The tape's own recomputing node.
    CHECKPOINT = "checkpoint",
}

// nn-level ops: matmul, linear, convolution, pooling, interpolation,
// embedding, indexing (gather/scatter/index_select/cat/stack/split/pad),
// dropout, losses, attention.
registry! {NN_OPS:
    MATMUL = "matmul",
    LINEAR = "linear",
    CONV2D = "conv2d",
    MAX_POOL2D = "max_pool2d",
    AVG_POOL2D = "avg_pool2d",
    ADAPTIVE_AVG_POOL2D = "adaptive_avg_pool2d",
    INTERPOLATE_BILINEAR = "interpolate_bilinear",
    INDEX_SELECT = "index_select",
    GATHER = "gather",
    SCATTER_ADD = "scatter_add",
    MASKED_FILL = "masked_fill",
    EMBEDDING = "embedding",
    TOPK = "topk",
    CAT = "cat",
    STACK = "stack",
    SPLIT = "split",
    CHUNK = "chunk",
    PAD = "pad",
    REPEAT = "repeat",
    TRIL = "tril",
    TRIU = "triu",
    DROPOUT = "dropout",
    CROSS_ENTROPY = "cross_entropy",
    SCALED_DOT_PRODUCT_ATTENTION = "scaled_dot_product_attention",
}

/// Composite entry points: functions that record their parts (matmul,
/// softmax, ...) rather than a node of their own, so they are not in
/// [`DIFFERENTIABLE_OPS`]. They are named so that the autocast table
/// ([`crate::autocast::cast_policy`]) can give them a policy of their own.
/// `Var::nll_loss`.
pub const NLL_LOSS: Op = Op("nll_loss");
/// `Var::mse_loss` (composite; see [`NLL_LOSS`]).
pub const MSE_LOSS: Op = Op("mse_loss");
/// `Var::bce_with_logits` (composite; see [`NLL_LOSS`]).
pub const BCE_WITH_LOGITS: Op = Op("bce_with_logits");

/// The name of every differentiable op recorded in this crate.
pub const DIFFERENTIABLE_OPS: &[&str] = &concat::<{ TENSOR_OPS.len() + NN_OPS.len() }>(TENSOR_OPS, NN_OPS);

/// `a` followed by `b`, as an array of length `N = a.len() + b.len()`.
const fn concat<const N: usize>(a: &[&'static str], b: &[&'static str]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < a.len() {
        out[i] = a[i];
        i += 1;
    }
    while i < N {
        out[i] = b[i - a.len()];
        i += 1;
    }
    out
}

/// True when `name` is a registered op.
pub fn is_registered(name: &str) -> bool {
    DIFFERENTIABLE_OPS.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_both_blocks_are_listed() {
        let mut seen = std::collections::HashSet::new();
        for name in DIFFERENTIABLE_OPS {
            assert!(!name.is_empty());
            assert!(seen.insert(*name), "op `{name}` registered twice");
        }
        assert_eq!(DIFFERENTIABLE_OPS.len(), TENSOR_OPS.len() + NN_OPS.len());
        assert!(is_registered(EXP.name()) && is_registered(CHECKPOINT.name()));
        assert!(!is_registered("no_such_op"));
    }
}
