//! Splitting a list of layers into contiguous parts, one per virtual stage
//! (DeepSpeed's `PipelineModule(partition_method=...)`).

use crate::error::{CommError, Result};

/// How [`crate::pipeline::PipelineModule`] splits its layers into parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partition {
    /// Equal layer counts, the first `L mod n` parts one layer longer
    /// (DeepSpeed's `uniform`).
    Layers,
    /// Contiguous parts whose largest parameter count is as small as
    /// possible (DeepSpeed's `parameters`, solved exactly; among equally
    /// good splits, the same one on every rank).
    Parameters,
    /// Explicit boundaries: `n + 1` increasing layer indices from 0 to `L`,
    /// part `k` holding layers `bounds[k] .. bounds[k + 1]`.
    Explicit(Vec<usize>),
}

impl Partition {
    /// The `parts + 1` boundaries of this partition of layers whose
    /// parameter counts are `weights`. Errors when there are fewer layers
    /// than parts (every part needs a layer), when `parts` is 0, and when
    /// explicit boundaries are not `parts + 1` strictly increasing indices
    /// from 0 to the layer count.
    pub fn bounds(&self, weights: &[usize], parts: usize) -> Result<Vec<usize>> {
        const OP: &str = "Partition::bounds";
        let layers = weights.len();
        if parts == 0 || layers < parts {
            return Err(CommError::arg(
                OP,
                format!("{layers} layers cannot fill {parts} pipeline parts (each needs at least one layer)"),
            ));
        }
        match self {
            Partition::Layers => {
                let (base, extra) = (layers / parts, layers % parts);
                let mut b = vec![0];
                for k in 0..parts {
                    b.push(b[k] + base + usize::from(k < extra));
                }
                Ok(b)
            }
            Partition::Parameters => Ok(balanced(weights, parts)),
            Partition::Explicit(b) => {
                let ok = b.len() == parts + 1
                    && b.first() == Some(&0)
                    && b.last() == Some(&layers)
                    && b.windows(2).all(|w| w[0] < w[1]);
                if ok {
                    Ok(b.clone())
                } else {
                    Err(CommError::arg(
                        OP,
                        format!(
                            "boundaries {b:?} must be {} strictly increasing layer indices from 0 to {layers}",
                            parts + 1
                        ),
                    ))
                }
            }
        }
    }
}

/// The boundaries minimising the largest part's weight (linear partition by
/// dynamic programming: `best[k][i]` is the smallest possible maximum over
/// the first `i` layers in `k` parts).
fn balanced(w: &[usize], parts: usize) -> Vec<usize> {
    let n = w.len();
    let mut prefix = vec![0usize; n + 1];
    for i in 0..n {
        prefix[i + 1] = prefix[i] + w[i];
    }
    let sum = |a: usize, b: usize| prefix[b] - prefix[a];
    let mut best = vec![vec![usize::MAX; n + 1]; parts + 1];
    let mut cut = vec![vec![0usize; n + 1]; parts + 1];
    best[0][0] = 0;
    for k in 1..=parts {
        for i in k..=n {
            for j in k - 1..i {
                if best[k - 1][j] == usize::MAX {
                    continue;
                }
                let cost = best[k - 1][j].max(sum(j, i));
                if cost < best[k][i] {
                    best[k][i] = cost;
                    cut[k][i] = j;
                }
            }
        }
    }
    let mut b = vec![n];
    let mut i = n;
    for k in (1..=parts).rev() {
        i = cut[k][i];
        b.push(i);
    }
    b.reverse();
    b
}

#[cfg(test)]
#[path = "partition_tests.rs"]
mod tests;
