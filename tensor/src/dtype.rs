//! Element types: the runtime [`DType`] tag and the [`Element`] trait that
//! ties each tag to its Rust type.

use half::{bf16, f16};

/// The element type of a tensor, chosen at run time.
///
/// f16 and bf16 are storage types: on the CPU their arithmetic runs in f32 and
/// rounds back (round-to-nearest-even). `Bool` stores one byte per element,
/// always 0 or 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
    /// 16-bit IEEE half float.
    F16,
    /// 16-bit brain float.
    BF16,
    /// 64-bit signed integer (indices, labels).
    I64,
    /// 32-bit unsigned integer.
    U32,
    /// 8-bit unsigned integer (images).
    U8,
    /// Boolean, one byte per element.
    Bool,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::U32,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// True for the floating-point dtypes (f32, f64, f16, bf16).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// True for the integer dtypes (i64, u32, u8); bool is not an integer.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::U32 | DType::U8)
    }

    /// The dtype a binary op on `self` and `other` computes in, by PyTorch's
    /// promotion rules: bool < integers < floats by category; within a
    /// category the wider type; f16 with bf16 gives f32; u32 with i64 gives i64.
    pub fn promote(self, other: DType) -> DType {
        use DType::*;
        if self == other {
            return self;
        }
        let rank = |d: DType| match d {
            Bool => 0,
            U8 => 1,
            U32 => 2,
            I64 => 3,
            F16 | BF16 => 4,
            F32 => 5,
            F64 => 6,
        };
        match (self, other) {
            (F16, BF16) | (BF16, F16) => F32,
            _ if rank(self) >= rank(other) => self,
            _ => other,
        }
    }

    /// PyTorch's name of the dtype (`float32`, `bfloat16`, `int64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I64 => "int64",
            DType::U32 => "uint32",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be a tensor element. Conversions go through f64,
/// which represents every value of every element type except i64 beyond 2^53
/// (use [`Element::to_i64`] / [`Element::from_i64`] for exact integers).
pub trait Element: Copy + Send + Sync + PartialOrd + PartialEq + Default + std::fmt::Debug + 'static {
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// The additive identity.
    const ZERO: Self;
    /// The multiplicative identity.
    const ONE: Self;
    /// The value as f64 (exact except for i64 beyond 2^53).
    fn to_f64(self) -> f64;
    /// The nearest value of this type to `v` (round-to-nearest-even for
    /// floats; saturating, truncating toward zero for integers, NaN → 0;
    /// non-zero → true for bool).
    fn from_f64(v: f64) -> Self;
    /// The value as f32.
    fn to_f32(self) -> f32;
    /// The nearest value of this type to `v` (rules as [`Element::from_f64`]).
    fn from_f32(v: f32) -> Self;
    /// The value as i64 (floats truncate toward zero, saturating).
    fn to_i64(self) -> i64;
    /// `v` converted to this type (saturating for narrower integers).
    fn from_i64(v: i64) -> Self;
}

macro_rules! float_element {
    ($t:ty, $dt:expr, $zero:expr, $one:expr, to_f32: $to32:expr, from_f32: $from32:expr, to_f64: $to64:expr, from_f64: $from64:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            const ZERO: Self = $zero;
            const ONE: Self = $one;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                $to64(self)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                $from64(v)
            }
            #[inline(always)]
            fn to_f32(self) -> f32 {
                $to32(self)
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                $from32(v)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self.to_f64() as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                Self::from_f64(v as f64)
            }
        }
    };
}

float_element!(f32, DType::F32, 0.0, 1.0,
    to_f32: |x: f32| x, from_f32: |v: f32| v, to_f64: |x: f32| x as f64, from_f64: |v: f64| v as f32);
float_element!(f64, DType::F64, 0.0, 1.0,
    to_f32: |x: f64| x as f32, from_f32: |v: f32| v as f64, to_f64: |x: f64| x, from_f64: |v: f64| v);
float_element!(f16, DType::F16, f16::ZERO, f16::ONE,
    to_f32: f16::to_f32, from_f32: f16::from_f32, to_f64: f16::to_f64, from_f64: f16::from_f64);
float_element!(bf16, DType::BF16, bf16::ZERO, bf16::ONE,
    to_f32: bf16::to_f32, from_f32: bf16::from_f32, to_f64: bf16::to_f64, from_f64: bf16::from_f64);

macro_rules! int_element {
    ($t:ty, $dt:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            const ZERO: Self = 0;
            const ONE: Self = 1;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                // `as` saturates and maps NaN to 0.
                v as $t
            }
            #[inline(always)]
            fn to_f32(self) -> f32 {
                self as f32
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v.clamp(<$t>::MIN as i64, <$t>::MAX as i64) as $t
            }
        }
    };
}

int_element!(u8, DType::U8);
int_element!(u32, DType::U32);

impl Element for i64 {
    const DTYPE: DType = DType::I64;
    const ZERO: Self = 0;
    const ONE: Self = 1;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as i64
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as i64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v
    }
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    const ZERO: Self = false;
    const ONE: Self = true;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as u8 as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v != 0.0
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v != 0
    }
}

/// A float element type whose arithmetic the CPU runs in `Self::Math`
/// (f32 for f32/f16/bf16, f64 for f64). Kernels written once over
/// [`FloatMath`] serve all four float dtypes.
pub trait FloatElement: Element {
    /// The type the arithmetic runs in.
    type Math: FloatMath;
    /// Widen to the math type.
    fn to_math(self) -> Self::Math;
    /// Round from the math type (round-to-nearest-even for f16/bf16).
    fn from_math(v: Self::Math) -> Self;
}

impl FloatElement for f32 {
    type Math = f32;
    #[inline(always)]
    fn to_math(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_math(v: f32) -> Self {
        v
    }
}
impl FloatElement for f64 {
    type Math = f64;
    #[inline(always)]
    fn to_math(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_math(v: f64) -> Self {
        v
    }
}
impl FloatElement for f16 {
    type Math = f32;
    #[inline(always)]
    fn to_math(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn from_math(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl FloatElement for bf16 {
    type Math = f32;
    #[inline(always)]
    fn to_math(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn from_math(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// The float arithmetic the CPU kernels are written in: implemented by f32 and f64.
pub trait FloatMath:
    Copy
    + Send
    + Sync
    + PartialOrd
    + std::fmt::Debug
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::ops::AddAssign
    + 'static
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// +infinity.
    const INFINITY: Self;
    /// -infinity.
    const NEG_INFINITY: Self;
    /// Conversion from f64 (rounding).
    fn of(v: f64) -> Self;
    /// Conversion to f64 (exact).
    fn f64(self) -> f64;
    /// e^self.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// ln(1 + self), accurate near 0.
    fn ln_1p(self) -> Self;
    /// e^self − 1, accurate near 0.
    fn exp_m1(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// Sine.
    fn sin(self) -> Self;
    /// Cosine.
    fn cos(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// self^p.
    fn powf(self, p: Self) -> Self;
    /// Largest integer ≤ self.
    fn floor(self) -> Self;
    /// Smallest integer ≥ self.
    fn ceil(self) -> Self;
    /// Round half to even (PyTorch's `round`).
    fn round_even(self) -> Self;
    /// The larger of the two; NaN if either is NaN (PyTorch's `maximum`).
    fn max_nan(self, o: Self) -> Self;
    /// The smaller of the two; NaN if either is NaN (PyTorch's `minimum`).
    fn min_nan(self, o: Self) -> Self;
    /// True for NaN.
    fn is_nan(self) -> bool;
    /// The Gauss error function.
    fn erf(self) -> Self;
}

macro_rules! float_math {
    ($t:ident) => {
        impl FloatMath for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const INFINITY: Self = $t::INFINITY;
            const NEG_INFINITY: Self = $t::NEG_INFINITY;
            #[inline(always)]
            fn of(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $t::exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                $t::ln(self)
            }
            #[inline(always)]
            fn ln_1p(self) -> Self {
                $t::ln_1p(self)
            }
            #[inline(always)]
            fn exp_m1(self) -> Self {
                $t::exp_m1(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                $t::sqrt(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $t::tanh(self)
            }
            #[inline(always)]
            fn sin(self) -> Self {
                $t::sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                $t::cos(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                $t::abs(self)
            }
            #[inline(always)]
            fn powf(self, p: Self) -> Self {
                $t::powf(self, p)
            }
            #[inline(always)]
            fn floor(self) -> Self {
                $t::floor(self)
            }
            #[inline(always)]
            fn ceil(self) -> Self {
                $t::ceil(self)
            }
            #[inline(always)]
            fn round_even(self) -> Self {
                $t::round_ties_even(self)
            }
            #[inline(always)]
            fn max_nan(self, o: Self) -> Self {
                if self.is_nan() || o.is_nan() {
                    $t::NAN
                } else if self >= o {
                    self
                } else {
                    o
                }
            }
            #[inline(always)]
            fn min_nan(self, o: Self) -> Self {
                if self.is_nan() || o.is_nan() {
                    $t::NAN
                } else if self <= o {
                    self
                } else {
                    o
                }
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                $t::is_nan(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                crate::special::erf(self as f64) as $t
            }
        }
    };
}
float_math!(f32);
float_math!(f64);

/// Runs `$body` with `$T` bound to the Rust type of `$dtype` (any of the
/// eight dtypes).
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = $crate::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = $crate::bf16;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::Bool => {
                type $T = bool;
                $body
            }
        }
    };
}

/// Runs `$body` with `$T` bound to the Rust type of a float `$dtype`;
/// evaluates `$other` for the non-float dtypes.
#[macro_export]
macro_rules! with_float_dtype {
    ($dtype:expr, $T:ident => $body:expr, else $other:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = $crate::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = $crate::bf16;
                $body
            }
            _ => $other,
        }
    };
}

/// Runs `$body` with `$T` bound to the Rust type of an integer `$dtype`
/// (i64, u32, u8); evaluates `$other` for floats and bool.
macro_rules! with_int_dtype {
    ($dtype:expr, $T:ident => $body:expr, else $other:expr) => {
        match $dtype {
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            _ => $other,
        }
    };
}
pub(crate) use with_int_dtype;
