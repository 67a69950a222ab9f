//! The gradcheck case table and the strategies the cases draw from.
//!
//! A [`Case`] names the registered ops it covers and a `check` that runs a
//! proptest of `n` random cases, gradchecking each, and returns the union of
//! the op names the checked graphs recorded. The `cases!` macro defines a
//! module's `CASES` table and one `#[test]` per case; `main.rs` concatenates
//! every module's table for the coverage test.

use std::cell::RefCell;
use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tessera_autograd::{gradcheck, GradcheckOptions, GradcheckReport, Var};
use tessera_tensor::{Result, Tensor};

/// What a case's check returns: the op names seen, or the failure.
pub type Checked = std::result::Result<BTreeSet<&'static str>, String>;

/// One row of the gradcheck table.
pub struct Case {
    /// The test's name.
    pub name: &'static str,
    /// The registered op names this case must exercise.
    pub ops: &'static [&'static str],
    /// Runs the case with `n` proptest cases.
    pub check: fn(u32) -> Checked,
}

/// Proptest cases per op in the per-case tests (the coverage test runs 1).
pub const CASES_PER_OP: u32 = 32;

/// Defines `pub const CASES` and one test per case. Each entry is
/// `name: ["op", ...] => check_fn;` with `check_fn: fn(u32) -> Checked` in
/// the same module.
macro_rules! cases {
    ($($name:ident: [$($op:expr),* $(,)?] => $check:ident;)*) => {
        /// This module's gradcheck cases.
        pub const CASES: &[$crate::gradcheck::common::Case] = &[$(
            $crate::gradcheck::common::Case { name: stringify!($name), ops: &[$($op),*], check: $check },
        )*];

        #[allow(non_snake_case)]
        mod generated {
            $(
                #[test]
                fn $name() {
                    $crate::gradcheck::common::run_case(&$crate::gradcheck::common::Case {
                        name: stringify!($name),
                        ops: &[$($op),*],
                        check: super::$check,
                    }, $crate::gradcheck::common::CASES_PER_OP);
                }
            )*
        }
    };
}

/// Runs `case` with `n` proptest cases; panics with the failure, or when a
/// declared op did not appear in the checked graphs.
pub fn run_case(case: &Case, n: u32) -> BTreeSet<&'static str> {
    let seen = (case.check)(n).unwrap_or_else(|e| panic!("case `{}` failed: {e}", case.name));
    for op in case.ops {
        assert!(
            seen.contains(op),
            "case `{}` declares op `{op}` but its graphs recorded only {seen:?}",
            case.name
        );
    }
    seen
}

/// Runs a proptest of `n` cases over `strategy`; `f` gradchecks one value.
/// Returns the union of the reports' op names.
pub fn prop<S: Strategy>(
    n: u32,
    strategy: S,
    f: impl Fn(S::Value) -> std::result::Result<GradcheckReport, TestCaseError>,
) -> Checked {
    let config = Config {
        cases: n,
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    };
    let seen = RefCell::new(BTreeSet::new());
    TestRunner::new(config)
        .run(&strategy, |v| {
            let report = f(v)?;
            seen.borrow_mut().extend(report.ops);
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    Ok(seen.into_inner())
}

/// Gradchecks `f` at `inputs` with the default options (eps 1e-6, atol
/// 1e-5, rtol 1e-3, f64).
pub fn check(
    inputs: &[Tensor],
    f: impl Fn(&[Var]) -> Result<Var>,
) -> std::result::Result<GradcheckReport, TestCaseError> {
    check_with(inputs, GradcheckOptions::default(), f)
}

/// Gradchecks `f` at `inputs` with `opts`.
pub fn check_with(
    inputs: &[Tensor],
    opts: GradcheckOptions,
    f: impl Fn(&[Var]) -> Result<Var>,
) -> std::result::Result<GradcheckReport, TestCaseError> {
    gradcheck(f, inputs, opts).map_err(|e| TestCaseError::fail(e.to_string()))
}

/// Asserts inside a proptest that `got` (any float dtype) equals `want`
/// elementwise within `tol·(1 + |want|)` (NaN matches NaN).
pub fn close(got: &Tensor, want: &[f64], tol: f64) -> std::result::Result<(), TestCaseError> {
    let got = got
        .to_dtype(tessera_tensor::DType::F64)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec::<f64>()
        .map_err(fail)?;
    prop_assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= tol * (1.0 + w.abs());
        prop_assert!(ok, "element {i}: got {g}, want {w}");
    }
    Ok(())
}

/// A tensor error as a proptest failure.
pub fn fail(e: tessera_tensor::Error) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// An f64 tensor of `shape` holding `values`.
pub fn tensor(values: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape).expect("values match the shape")
}

/// Where the checked values are drawn from. Finite differences need the
/// function smooth within ±eps of every point, so kinks (0 for abs/relu)
/// are kept away from.
#[derive(Debug, Clone, Copy)]
pub enum Domain {
    /// Uniform in [−2, 2].
    Any,
    /// Uniform in [0.2, 3].
    Positive,
    /// |x| in [0.1, 2] with either sign.
    AwayFromZero,
}

/// `n` values from `domain`.
pub fn values(n: usize, domain: Domain) -> BoxedStrategy<Vec<f64>> {
    match domain {
        Domain::Any => prop::collection::vec(-2.0..2.0f64, n).boxed(),
        Domain::Positive => prop::collection::vec(0.2..3.0f64, n).boxed(),
        Domain::AwayFromZero => prop::collection::vec((0.1..2.0f64, any::<bool>()), n)
            .prop_map(|v| v.into_iter().map(|(m, s)| if s { m } else { -m }).collect())
            .boxed(),
    }
}

/// Shapes of rank 0–4 with sizes 0–5.
pub fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..=5, 0..=4)
}

/// Shapes of rank `ranks` with sizes in `sizes`.
pub fn shape_in(
    ranks: std::ops::RangeInclusive<usize>,
    sizes: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(sizes, ranks)
}

/// How a checked input is laid out when the op sees it: the leaf is stored
/// contiguous in [`Arrange::stored`] shape and turned into a (possibly
/// non-contiguous) view of the wanted shape by [`Arrange::apply`] inside the
/// checked function, so the op runs on strided data and the view's gradient
/// is checked on the way.
#[derive(Debug, Clone, Copy)]
pub enum Arrange {
    /// As is.
    Contiguous,
    /// Stored with the dims reversed, then permuted back (a transpose).
    Transposed,
    /// Stored flipped along every dim, then flipped back (negative strides).
    Flipped,
    /// Stored with the last dim doubled, then every second element taken.
    Strided,
}

impl Arrange {
    /// The shape of the stored leaf for a view of `shape`.
    pub fn stored(self, shape: &[usize]) -> Vec<usize> {
        match self {
            Arrange::Contiguous | Arrange::Flipped => shape.to_vec(),
            Arrange::Transposed => shape.iter().rev().copied().collect(),
            Arrange::Strided => {
                let mut s = shape.to_vec();
                if let Some(last) = s.last_mut() {
                    *last *= 2;
                }
                s
            }
        }
    }

    /// The view of `x` (stored as [`Arrange::stored`]) with the wanted shape.
    pub fn apply(self, x: &Var) -> Result<Var> {
        let nd = x.ndim() as isize;
        match self {
            Arrange::Contiguous => Ok(x.clone()),
            Arrange::Transposed => x.permute(&(0..nd).rev().collect::<Vec<_>>()),
            Arrange::Flipped => x.flip(&(0..nd).collect::<Vec<_>>()),
            Arrange::Strided if nd == 0 => Ok(x.clone()),
            Arrange::Strided => {
                let n = x.shape()[nd as usize - 1];
                x.slice(-1, 0, n, 2)
            }
        }
    }
}

/// Any [`Arrange`].
pub fn arrange() -> impl Strategy<Value = Arrange> {
    prop_oneof![
        Just(Arrange::Contiguous),
        Just(Arrange::Transposed),
        Just(Arrange::Flipped),
        Just(Arrange::Strided),
    ]
}

/// One checked input: the wanted shape, how it is laid out, and the stored
/// values (length = numel of the stored shape).
#[derive(Debug, Clone)]
pub struct Input {
    /// The shape the op sees.
    pub shape: Vec<usize>,
    /// The layout it sees it in.
    pub arrange: Arrange,
    /// The stored leaf's values.
    pub values: Vec<f64>,
}

impl Input {
    /// The stored leaf tensor.
    pub fn leaf(&self) -> Tensor {
        tensor(&self.values, &self.arrange.stored(&self.shape))
    }

    /// The values the op sees, in row-major order of [`Input::shape`].
    pub fn seen(&self) -> Vec<f64> {
        let v = Var::constant(self.leaf());
        self.arrange
            .apply(&v)
            .expect("arrangement")
            .tensor()
            .contiguous()
            .unwrap()
            .to_vec::<f64>()
            .expect("f64")
    }
}

/// An input of `shape` with any arrangement and values from `domain`.
pub fn input_of(shape: Vec<usize>, domain: Domain) -> impl Strategy<Value = Input> {
    arrange().prop_flat_map(move |a| {
        let shape = shape.clone();
        let n = a.stored(&shape).iter().product();
        values(n, domain).prop_map(move |values| Input {
            shape: shape.clone(),
            arrange: a,
            values,
        })
    })
}

/// An input of random shape (rank 0–4, sizes 0–5).
pub fn input(domain: Domain) -> impl Strategy<Value = Input> {
    shape().prop_flat_map(move |s| input_of(s, domain))
}

/// Two shapes that broadcast together: each is a suffix of a common shape
/// with some dims set to 1.
pub fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    shape().prop_flat_map(|out| {
        let r = out.len();
        (
            Just(out),
            0..=r,
            0..=r,
            prop::collection::vec(any::<bool>(), r),
            prop::collection::vec(any::<bool>(), r),
        )
            .prop_map(|(out, ra, rb, ones_a, ones_b)| {
                let pick = |rank: usize, ones: &[bool]| -> Vec<usize> {
                    (out.len() - rank..out.len())
                        .map(|d| if ones[d] { 1 } else { out[d] })
                        .collect()
                };
                (pick(ra, &ones_a), pick(rb, &ones_b))
            })
    })
}

/// Two inputs whose shapes broadcast together, each arranged at random.
pub fn input_pair(da: Domain, db: Domain) -> impl Strategy<Value = (Input, Input)> {
    broadcast_pair().prop_flat_map(move |(a, b)| (input_of(a, da), input_of(b, db)))
}

/// A dim of a rank-`nd` value (−nd ..= nd−1), for rank ≥ 1.
pub fn dim_of(nd: usize) -> impl Strategy<Value = isize> {
    let nd = nd.max(1) as isize;
    -nd..nd
}
