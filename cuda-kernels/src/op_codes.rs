//! The elementwise op codes, defined once for every backend.
//!
//! [`UnaryOp`], [`BinaryOp`], [`CompareOp`] and [`ReduceOp`] are the ops of
//! the elementwise and reduction engines: the
//! tensor crate's SIMD and scalar CPU kernels match on them, and the CUDA
//! kernels receive their codes. The `.cu` sources never spell a code: they
//! are compiled with [`cuda_header`] in front (NVRTC at run time, the
//! emulator's C++ compiler at build time), which defines `UNARY_<NAME>`,
//! `BINARY_<NAME>`, `COMPARE_<NAME>`, `REDUCE_<NAME>` and the X-macros
//! `TESSERA_UNARY_OPS(X)`, `TESSERA_BINARY_OPS(X)`, `TESSERA_COMPARE_OPS(X)`,
//! `TESSERA_REDUCE_OPS(X)`; `reduce.cu` builds its
//! switches the same way. `elementwise.cu` builds its `switch` from those
//! X-macros, one `case` per op calling `unary_<NAME>` / `binary_<NAME>`, so a
//! variant added here without its CUDA math fails to compile, and no code
//! can mean another op.
//!
//! This module has no dependency (the build script includes it), so it is
//! compiled without the feature `cuda` too.

use std::fmt::Write as _;

/// Defines an op enum with its codes (the discriminants, in order from 0),
/// the op names the tensor API reports in errors, and the CUDA names.
macro_rules! op_enum {
    ($(#[$m:meta])* $E:ident, $all:literal { $($(#[$vm:meta])* $V:ident => $name:literal, $cuda:literal;)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(i32)]
        pub enum $E {
            $($(#[$vm])* $V,)*
        }

        impl $E {
            /// Every op, in code order.
            pub const ALL: [$E; $all] = [$($E::$V),*];

            /// The op's code, as the CUDA kernels receive it.
            pub fn code(self) -> i32 {
                self as i32
            }

            /// The name of the tensor op, as errors report it (`"exp"`).
            pub fn name(self) -> &'static str {
                match self {
                    $($E::$V => $name,)*
                }
            }

            /// The name in the CUDA sources (`EXP` in `UNARY_EXP`).
            pub fn cuda_name(self) -> &'static str {
                match self {
                    $($E::$V => $cuda,)*
                }
            }
        }
    };
}

op_enum! {
    /// Elementwise functions of one operand.
    UnaryOp, 24 {
        /// x (a strided copy makes a view contiguous).
        Identity => "identity", "IDENTITY";
        /// −x
        Neg => "neg", "NEG";
        /// |x|
        Abs => "abs", "ABS";
        /// −1, 0 or 1 by the sign of x (0 for NaN).
        Sign => "sign", "SIGN";
        /// x²
        Square => "square", "SQUARE";
        /// max(x, 0), NaN kept.
        Relu => "relu", "RELU";
        /// ⌊x⌋
        Floor => "floor", "FLOOR";
        /// ⌈x⌉
        Ceil => "ceil", "CEIL";
        /// x rounded half to even.
        Round => "round", "ROUND";
        /// e^x
        Exp => "exp", "EXP";
        /// ln x
        Log => "log", "LOG";
        /// ln(1 + x)
        Log1p => "log1p", "LOG1P";
        /// e^x − 1
        Expm1 => "expm1", "EXPM1";
        /// √x
        Sqrt => "sqrt", "SQRT";
        /// 1/√x
        Rsqrt => "rsqrt", "RSQRT";
        /// 1/x
        Recip => "recip", "RECIP";
        /// sin x
        Sin => "sin", "SIN";
        /// cos x
        Cos => "cos", "COS";
        /// tanh x
        Tanh => "tanh", "TANH";
        /// 1/(1 + e^−x)
        Sigmoid => "sigmoid", "SIGMOID";
        /// x·Φ(x) with erf.
        GeluErf => "gelu", "GELU_ERF";
        /// GELU, tanh approximation.
        GeluTanh => "gelu", "GELU_TANH";
        /// x·sigmoid(x)
        Silu => "silu", "SILU";
        /// The Gauss error function.
        Erf => "erf", "ERF";
    }
}

impl UnaryOp {
    /// True when the op keeps an integer input's dtype (neg, abs, sign,
    /// square, relu, rounding); the others compute integers in f32.
    pub fn keeps_dtype(self) -> bool {
        matches!(
            self,
            UnaryOp::Identity
                | UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Sign
                | UnaryOp::Square
                | UnaryOp::Relu
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
        )
    }
}

op_enum! {
    /// Elementwise functions of two operands (broadcast). Besides the
    /// arithmetic, the fused derivative rules of unary ops: `(g, x)` or
    /// `(g, y)` pairs giving the gradient of the input in one pass.
    BinaryOp, 14 {
        /// a + b
        Add => "add", "ADD";
        /// a − b
        Sub => "sub", "SUB";
        /// a · b
        Mul => "mul", "MUL";
        /// a / b
        Div => "div", "DIV";
        /// max(a, b), NaN propagates.
        Maximum => "maximum", "MAXIMUM";
        /// min(a, b), NaN propagates.
        Minimum => "minimum", "MINIMUM";
        /// a^b
        Pow => "pow", "POW";
        /// g · GELU′(x), exact form: (g, x).
        GeluErfBackward => "gelu_backward", "GELU_ERF_BACKWARD";
        /// g · GELU′(x), tanh form: (g, x).
        GeluTanhBackward => "gelu_backward", "GELU_TANH_BACKWARD";
        /// g · SiLU′(x): (g, x).
        SiluBackward => "silu_backward", "SILU_BACKWARD";
        /// g · y(1 − y) for y = sigmoid(x): (g, y).
        SigmoidBackward => "sigmoid_backward", "SIGMOID_BACKWARD";
        /// g · (1 − y²) for y = tanh(x): (g, y).
        TanhBackward => "tanh_backward", "TANH_BACKWARD";
        /// g where y > 0, else 0, for y = relu(x): (g, y).
        ReluBackward => "relu_backward", "RELU_BACKWARD";
        /// g · sign(x) (0 at x = 0): (g, x).
        AbsBackward => "abs_backward", "ABS_BACKWARD";
    }
}

impl BinaryOp {
    /// True for the fused derivative rules, which are defined on floats only.
    pub fn is_backward(self) -> bool {
        !matches!(
            self,
            BinaryOp::Add
                | BinaryOp::Sub
                | BinaryOp::Mul
                | BinaryOp::Div
                | BinaryOp::Maximum
                | BinaryOp::Minimum
                | BinaryOp::Pow
        )
    }
}

op_enum! {
    /// Elementwise predicates of two operands (broadcast), giving bool:
    /// the comparisons, in the operands' dtype (NaN compares unequal to
    /// everything), and the logical ops on truth values (non-zero, NaN
    /// included, is true).
    CompareOp, 9 {
        /// a == b
        Eq => "eq", "EQ";
        /// a != b (true where either is NaN)
        Ne => "ne", "NE";
        /// a < b
        Lt => "lt", "LT";
        /// a <= b
        Le => "le", "LE";
        /// a > b
        Gt => "gt", "GT";
        /// a >= b
        Ge => "ge", "GE";
        /// a and b are both true
        And => "logical_and", "AND";
        /// a or b is true
        Or => "logical_or", "OR";
        /// exactly one of a and b is true
        Xor => "logical_xor", "XOR";
    }
}

op_enum! {
    /// Reductions over one dimension (the mean is a sum divided on the
    /// tensor side).
    ReduceOp, 4 {
        /// Σ x (f32 accumulation; 0 when empty).
        Sum => "sum", "SUM";
        /// Π x (1 when empty).
        Prod => "prod", "PROD";
        /// max x, NaN propagates.
        Max => "max", "MAX";
        /// min x, NaN propagates.
        Min => "min", "MIN";
    }
}

impl ReduceOp {
    /// True when the reduction of an empty dimension has a value (its
    /// identity); max and min of nothing are errors.
    pub fn has_identity(self) -> bool {
        matches!(self, ReduceOp::Sum | ReduceOp::Prod)
    }
}

/// The C header the `.cu` sources are compiled with: one `#define` per op
/// code and the X-macros listing every op.
pub fn cuda_header() -> String {
    let mut h = String::from("// Generated from tessera-cuda-kernels' op_codes.rs: do not edit.\n");
    let mut list = |prefix: &str, ops: &mut dyn Iterator<Item = (&'static str, i32)>| {
        let mut x = format!("#define TESSERA_{prefix}_OPS(X)");
        for (name, code) in ops {
            writeln!(h, "#define {prefix}_{name} {code}").expect("writing to a String");
            write!(x, " X({name})").expect("writing to a String");
        }
        h.push_str(&x);
        h.push('\n');
    };
    list(
        "UNARY",
        &mut UnaryOp::ALL.iter().map(|o| (o.cuda_name(), o.code())),
    );
    list(
        "BINARY",
        &mut BinaryOp::ALL.iter().map(|o| (o.cuda_name(), o.code())),
    );
    list(
        "COMPARE",
        &mut CompareOp::ALL.iter().map(|o| (o.cuda_name(), o.code())),
    );
    list(
        "REDUCE",
        &mut ReduceOp::ALL.iter().map(|o| (o.cuda_name(), o.code())),
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_dense_and_names_unique() {
        for (i, op) in UnaryOp::ALL.iter().enumerate() {
            assert_eq!(op.code(), i as i32);
        }
        for (i, op) in BinaryOp::ALL.iter().enumerate() {
            assert_eq!(op.code(), i as i32);
        }
        for (i, op) in ReduceOp::ALL.iter().enumerate() {
            assert_eq!(op.code(), i as i32);
        }
        for (i, op) in CompareOp::ALL.iter().enumerate() {
            assert_eq!(op.code(), i as i32);
        }
        let mut names: Vec<_> = UnaryOp::ALL.iter().map(|o| o.cuda_name()).collect();
        names.extend(BinaryOp::ALL.iter().map(|o| o.cuda_name()));
        names.extend(CompareOp::ALL.iter().map(|o| o.cuda_name()));
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "CUDA names must be unique");
    }

    #[test]
    fn header_defines_every_code() {
        let h = cuda_header();
        assert!(h.contains("#define UNARY_EXP 9\n"), "{h}");
        assert!(h.contains("#define BINARY_POW 6\n"), "{h}");
        assert!(h.contains("X(IDENTITY) X(NEG)"), "{h}");
        assert!(h.contains("#define COMPARE_GE 5\n"), "{h}");
    }
}
