//! index_select, gather, scatter_add, masked_fill, embedding and topk.

use proptest::prelude::*;
use tessera_tensor::{DType, Tensor};

use super::{distinct_input, seen_var, view};
use crate::gradcheck::common::{check, close, fail, input_of, prop, Checked, Domain};

/// An i64 tensor of `shape` holding `values`.
fn long(values: Vec<i64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(values, shape).expect("values match the shape")
}

/// `count` indices in `0..size` (repeats allowed, so gradients add).
fn picks(size: usize, count: usize) -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(0..size as i64, count)
}

pub fn index_select_case(n: u32) -> Checked {
    let s = (prop::collection::vec(1usize..=3, 1..=3), 0usize..=4).prop_flat_map(|(shape, count)| {
        let nd = shape.len();
        (0..nd).prop_flat_map(move |d| {
            (
                input_of(shape.clone(), Domain::Any),
                Just(d),
                picks(shape[d], count),
            )
        })
    });
    prop(n, s, |(x, d, idx)| {
        let index = long(idx.clone(), &[idx.len()]);
        let report = check(&[x.leaf()], |xs| {
            view(&x, &xs[0])?.index_select(d as isize, &index)
        })?;
        // Forward: selecting every index one at a time and stacking agrees.
        let xv = seen_var(&x)?;
        let y = xv.index_select(d as isize, &index).map_err(fail)?;
        let want: Vec<Tensor> = idx
            .iter()
            .map(|&i| xv.tensor().narrow(d as isize, i as usize, 1))
            .collect::<tessera_tensor::Result<_>>()
            .map_err(fail)?;
        if !want.is_empty() {
            let want = Tensor::cat(&want, d as isize)
                .map_err(fail)?
                .contiguous()
                .unwrap()
                .to_vec::<f64>()
                .map_err(fail)?;
            close(y.tensor(), &want, 0.0)?;
        }
        Ok(report)
    })
}

pub fn gather_case(n: u32) -> Checked {
    let s = (1usize..=3, 1usize..=3, 0usize..=3, any::<bool>()).prop_flat_map(|(r, c, k, dim0)| {
        let (size, shape) = if dim0 { (r, vec![k, c]) } else { (c, vec![r, k]) };
        let count = shape.iter().product();
        (
            input_of(vec![r, c], Domain::Any),
            Just(dim0),
            Just(shape),
            picks(size, count),
        )
    });
    prop(n, s, |(x, dim0, shape, idx)| {
        let d = if dim0 { 0 } else { 1 };
        let index = long(idx.clone(), &shape);
        let report = check(&[x.leaf()], |xs| view(&x, &xs[0])?.gather(d, &index))?;
        let seen = x.seen();
        let cols = x.shape[1];
        let want: Vec<f64> = idx
            .iter()
            .enumerate()
            .map(|(f, &i)| {
                let (a, b) = (f / shape[1], f % shape[1]);
                if dim0 {
                    seen[i as usize * cols + b]
                } else {
                    seen[a * cols + i as usize]
                }
            })
            .collect();
        close(
            seen_var(&x)?.gather(d, &index).map_err(fail)?.tensor(),
            &want,
            0.0,
        )?;
        Ok(report)
    })
}

pub fn scatter_add_case(n: u32) -> Checked {
    // src [3, c+1] is wider than the index [k, c], so part of src gets no gradient.
    let s = (1usize..=3, 1usize..=3, 1usize..=3).prop_flat_map(|(r, c, k)| {
        (
            input_of(vec![r, c], Domain::Any),
            input_of(vec![3, c + 1], Domain::Any),
            Just((k, c)),
            picks(r, k * c),
        )
    });
    prop(n, s, |(x, src, (k, c), idx)| {
        let index = long(idx.clone(), &[k, c]);
        let report = check(&[x.leaf(), src.leaf()], |xs| {
            view(&x, &xs[0])?.scatter_add(0, &index, &view(&src, &xs[1])?)
        })?;
        let mut want = x.seen();
        let sv = src.seen();
        for (f, &i) in idx.iter().enumerate() {
            let (a, b) = (f / c, f % c);
            want[i as usize * c + b] += sv[a * (c + 1) + b];
        }
        let y = seen_var(&x)?
            .scatter_add(0, &index, &seen_var(&src)?)
            .map_err(fail)?;
        close(y.tensor(), &want, 1e-12)?;
        Ok(report)
    })
}

pub fn masked_fill_case(n: u32) -> Checked {
    // The mask [1, c] broadcasts over the rows of x [r, c].
    let s = (1usize..=3, 1usize..=4).prop_flat_map(|(r, c)| {
        (
            input_of(vec![r, c], Domain::Any),
            prop::collection::vec(any::<bool>(), c),
        )
    });
    prop(n, s, |(x, m)| {
        let mask = Tensor::from_vec(m.clone(), &[1, m.len()]).map_err(fail)?;
        let report = check(&[x.leaf()], |xs| view(&x, &xs[0])?.masked_fill(&mask, 7.5))?;
        let c = m.len();
        let want: Vec<f64> = x
            .seen()
            .iter()
            .enumerate()
            .map(|(i, &v)| if m[i % c] { 7.5 } else { v })
            .collect();
        close(
            seen_var(&x)?.masked_fill(&mask, 7.5).map_err(fail)?.tensor(),
            &want,
            0.0,
        )?;
        Ok(report)
    })
}

pub fn embedding_case(n: u32) -> Checked {
    let s = (
        1usize..=4,
        1usize..=3,
        prop::collection::vec(0usize..=3, 0..=2),
        any::<bool>(),
    )
        .prop_flat_map(|(v, d, ishape, pad)| {
            let count = ishape.iter().product();
            (
                input_of(vec![v, d], Domain::Any),
                Just(ishape),
                picks(v, count),
                Just(pad.then_some(0)),
            )
        });
    prop(n, s, |(w, ishape, idx, padding_idx)| {
        let index = long(idx.clone(), &ishape);
        // The padding row's gradient is zero by definition, not by calculus:
        // check it directly, and gradcheck a table whose padding row is unused.
        let used_pad = padding_idx.is_some_and(|p| idx.contains(&(p as i64)));
        let report = if used_pad {
            let g = seen_var(&w)?;
            let leaf = tessera_autograd::Var::leaf(g.tensor().contiguous().unwrap());
            let y = leaf.embedding(&index, padding_idx).map_err(fail)?;
            let grads = y
                .backward_with(&y.tensor().ones_like(None).map_err(fail)?)
                .map_err(fail)?;
            let gw = grads
                .get(&leaf)
                .expect("table gradient")
                .to_vec::<f64>()
                .map_err(fail)?;
            prop_assert!(gw[..w.shape[1]].iter().all(|&v| v == 0.0));
            check(&[w.leaf()], |xs| view(&w, &xs[0])?.embedding(&index, None))?
        } else {
            check(&[w.leaf()], |xs| view(&w, &xs[0])?.embedding(&index, padding_idx))?
        };
        let seen = w.seen();
        let d = w.shape[1];
        let want: Vec<f64> = idx
            .iter()
            .flat_map(|&i| seen[i as usize * d..(i as usize + 1) * d].to_vec())
            .collect();
        close(
            seen_var(&w)?
                .embedding(&index, padding_idx)
                .map_err(fail)?
                .tensor(),
            &want,
            0.0,
        )?;
        Ok(report)
    })
}

pub fn topk_case(n: u32) -> Checked {
    let s = (1usize..=3, 1usize..=5, any::<bool>())
        .prop_flat_map(|(r, c, largest)| (distinct_input(vec![r, c]), 0..=c, Just(largest)));
    prop(n, s, |(x, k, largest)| {
        let report = check(&[x.leaf()], |xs| {
            Ok(view(&x, &xs[0])?.topk(k, -1, largest, true)?.0)
        })?;
        let seen = x.seen();
        let c = x.shape[1];
        let want: Vec<f64> = seen
            .chunks(c)
            .flat_map(|row| {
                let mut r = row.to_vec();
                r.sort_by(|a, b| if largest { b.total_cmp(a) } else { a.total_cmp(b) });
                r.truncate(k);
                r
            })
            .collect();
        let (y, idx) = seen_var(&x)?.topk(k, -1, largest, true).map_err(fail)?;
        close(y.tensor(), &want, 0.0)?;
        prop_assert_eq!(idx.dtype(), DType::I64);
        Ok(report)
    })
}
