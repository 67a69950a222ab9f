//! Views: gradcheck on every arrangement (so views of views of strided
//! data), with random dims and ranges.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tessera_autograd::{GradcheckReport, Var};
use tessera_tensor::{broadcast_shapes, Result};

use crate::gradcheck::common::{
    broadcast_pair, check, close, dim_of, input_of, prop, shape, shape_in, Arrange, Checked, Domain, Input,
};

type CaseResult = std::result::Result<GradcheckReport, TestCaseError>;

/// Gradchecks `f(view of the input, arg)`.
fn check_view<A>(inp: &Input, arg: &A, f: impl Fn(&Var, &A) -> Result<Var>) -> CaseResult {
    check(&[inp.leaf()], |xs| f(&inp.arrange.apply(&xs[0])?, arg))
}

/// An input of rank `ranks` with sizes `sizes`, any arrangement.
fn input_ranked(
    ranks: std::ops::RangeInclusive<usize>,
    sizes: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = Input> {
    shape_in(ranks, sizes).prop_flat_map(|s| input_of(s, Domain::Any))
}

/// An input of rank ≥ 1 and one of its dims (resolved to 0..rank).
fn input_and_dim(min_size: usize) -> impl Strategy<Value = (Input, usize)> {
    input_ranked(1..=4, min_size..=5).prop_flat_map(|i| {
        let nd = i.shape.len();
        (Just(i), 0..nd)
    })
}

fn reshape(n: u32) -> Checked {
    prop(n, (input_ranked(0..=4, 0..=5), any::<bool>()), |(inp, flat)| {
        let target: Vec<Option<usize>> = if flat {
            vec![None]
        } else {
            inp.shape.iter().rev().map(|&s| Some(s)).collect()
        };
        check_view(&inp, &target, |x, t| x.reshape(t))
    })
}

fn view(n: u32) -> Checked {
    let contiguous = shape().prop_flat_map(|s| {
        let n = s.iter().product();
        crate::gradcheck::common::values(n, Domain::Any).prop_map(move |values| Input {
            shape: s.clone(),
            arrange: Arrange::Contiguous,
            values,
        })
    });
    prop(n, contiguous, |inp| {
        check_view(&inp, &(), |x, _| x.view(((),))?.exp())
    })
}

fn flatten(n: u32) -> Checked {
    let s = input_ranked(0..=4, 0..=4).prop_flat_map(|i| {
        let nd = i.shape.len().max(1) as isize;
        (Just(i), 0..nd, 0..nd)
    });
    prop(n, s, |(inp, a, b)| {
        check_view(&inp, &(a.min(b), a.max(b)), |x, &(s, e)| x.flatten(s, e))
    })
}

fn transpose(n: u32) -> Checked {
    let s = input_ranked(1..=4, 0..=5).prop_flat_map(|i| {
        let nd = i.shape.len();
        (Just(i), dim_of(nd), dim_of(nd))
    });
    prop(n, s, |(inp, a, b)| {
        let report = check_view(&inp, &(a, b), |x, &(a, b)| x.transpose(a, b))?;
        // Forward: element [i, j] of a transposed matrix is [j, i].
        if inp.shape.len() == 2 && (a - b).abs() == 1 {
            let x = inp
                .arrange
                .apply(&Var::constant(inp.leaf()))
                .map_err(crate::gradcheck::common::fail)?;
            let (r, c) = (inp.shape[0], inp.shape[1]);
            let seen = inp.seen();
            let want: Vec<f64> = (0..c)
                .flat_map(|j| (0..r).map(|i| seen[i * c + j]).collect::<Vec<_>>())
                .collect();
            close(
                x.t().map_err(crate::gradcheck::common::fail)?.tensor(),
                &want,
                0.0,
            )?;
        }
        Ok(report)
    })
}

fn t(n: u32) -> Checked {
    prop(n, input_ranked(2..=2, 0..=5), |inp| {
        check_view(&inp, &(), |x, _| x.t())
    })
}

fn permute(n: u32) -> Checked {
    let s = input_ranked(0..=4, 0..=5).prop_flat_map(|i| {
        let nd = i.shape.len();
        (Just(i), Just((0..nd as isize).collect::<Vec<_>>()).prop_shuffle())
    });
    prop(n, s, |(inp, dims)| check_view(&inp, &dims, |x, d| x.permute(d)))
}

fn narrow(n: u32) -> Checked {
    let s = input_and_dim(0).prop_flat_map(|(i, d)| {
        let size = i.shape[d];
        (Just(i), Just(d), 0..=size)
            .prop_flat_map(move |(i, d, start)| (Just(i), Just(d), Just(start), 0..=size - start))
    });
    prop(n, s, |(inp, d, start, len)| {
        check_view(&inp, &(), |x, _| x.narrow(d as isize, start, len))
    })
}

fn slice(n: u32) -> Checked {
    let s = input_and_dim(0).prop_flat_map(|(i, d)| {
        let size = i.shape[d];
        (Just(i), Just(d), 0..=size, 0..=size + 2, 1usize..=3)
    });
    prop(n, s, |(inp, d, start, end, step)| {
        let end = end.max(start);
        check_view(&inp, &(), |x, _| {
            x.slice(d as isize - inp.shape.len() as isize, start, end, step)
        })
    })
}

fn select(n: u32) -> Checked {
    let s = input_and_dim(1).prop_flat_map(|(i, d)| {
        let size = i.shape[d] as isize;
        (Just(i), Just(d), -size..size)
    });
    prop(n, s, |(inp, d, index)| {
        let report = check_view(&inp, &(), |x, _| x.select(d as isize, index))?;
        if inp.shape.len() == 1 {
            let x = inp
                .arrange
                .apply(&Var::constant(inp.leaf()))
                .map_err(crate::gradcheck::common::fail)?;
            let k = if index < 0 {
                index + inp.shape[0] as isize
            } else {
                index
            } as usize;
            close(
                x.select(0, index)
                    .map_err(crate::gradcheck::common::fail)?
                    .tensor(),
                &[inp.seen()[k]],
                0.0,
            )?;
        }
        Ok(report)
    })
}

fn flip(n: u32) -> Checked {
    let s = input_ranked(0..=4, 0..=5).prop_flat_map(|i| {
        let nd = i.shape.len();
        (Just(i), prop::collection::vec(any::<bool>(), nd))
    });
    prop(n, s, |(inp, which)| {
        let dims: Vec<isize> = (0..which.len())
            .filter(|&d| which[d])
            .map(|d| d as isize)
            .collect();
        check_view(&inp, &dims, |x, d| x.flip(d))
    })
}

fn expand(n: u32) -> Checked {
    let s = broadcast_pair().prop_flat_map(|(a, b)| {
        let out = broadcast_shapes("test", &a, &b).expect("broadcastable by construction");
        (input_of(a, Domain::Any), Just(out), any::<bool>())
    });
    prop(n, s, |(inp, out, keep)| {
        let lead = out.len() - inp.shape.len();
        let target: Vec<Option<usize>> = out
            .iter()
            .enumerate()
            .map(|(d, &s)| if keep && d >= lead { None } else { Some(s) })
            .collect();
        check_view(&inp, &target, |x, t| x.expand(t))?;
        check_view(&inp, &out, |x, o| x.broadcast_to(o))
    })
}

fn squeeze(n: u32) -> Checked {
    let s = input_ranked(1..=4, 1..=3).prop_flat_map(|i| {
        let nd = i.shape.len();
        (Just(i), 0..nd)
    });
    prop(n, s, |(mut inp, d)| {
        // Make dim d size 1 (dropping the values it no longer holds).
        inp.shape[d] = 1;
        let stored: usize = inp.arrange.stored(&inp.shape).iter().product();
        inp.values.truncate(stored);
        check_view(&inp, &(), |x, _| x.squeeze(d as isize))?;
        check_view(&inp, &(), |x, _| x.squeeze_all())
    })
}

fn unsqueeze(n: u32) -> Checked {
    let s = input_ranked(0..=3, 0..=5).prop_flat_map(|i| {
        let nd = i.shape.len() as isize;
        (Just(i), -(nd + 1)..=nd)
    });
    prop(n, s, |(inp, d)| check_view(&inp, &(), |x, _| x.unsqueeze(d)))
}

fn contiguous(n: u32) -> Checked {
    let s = shape_in(1..=4, 2..=4).prop_flat_map(|s| {
        crate::gradcheck::common::values(s.iter().product(), Domain::Any).prop_map(move |values| Input {
            shape: s.clone(),
            arrange: Arrange::Flipped,
            values,
        })
    });
    prop(n, s, |inp| check_view(&inp, &(), |x, _| x.contiguous()))
}

cases! {
    reshape: ["reshape"] => reshape;
    view: ["view"] => view;
    flatten: ["reshape"] => flatten;
    transpose: ["transpose"] => transpose;
    t: ["transpose"] => t;
    permute: ["permute"] => permute;
    narrow: ["narrow"] => narrow;
    slice: ["slice"] => slice;
    select: ["select"] => select;
    flip: ["flip"] => flip;
    expand: ["expand"] => expand;
    squeeze: ["squeeze"] => squeeze;
    unsqueeze: ["unsqueeze"] => unsqueeze;
    contiguous: ["contiguous"] => contiguous;
}
