//! The fused ("multi-tensor") update loop: one pass over a parameter's flat
//! buffer together with its gradient and state buffers, split across rayon
//! threads at fixed points, so the result never depends on the thread
//! count; plus deterministic sums of squares for norms.

use tessera_tensor::FloatElement;

/// Buffers up to this length are processed by one thread.
pub(crate) const CHUNK: usize = 1 << 15;

/// A parameter's state buffers as flat slices (unused ones empty), in the
/// order the optimizer's rule names them.
pub type Bufs<'a, T> = [&'a mut [T]; 3];

/// Calls `f` on aligned pieces of `p`, `g` and the non-empty buffers of `b`
/// (all of `p`'s length) and combines the pieces' results with `join`, in a
/// tree whose shape depends only on the length.
pub(crate) fn fused<T, R, F, J>(p: &mut [T], g: &[T], b: Bufs<'_, T>, f: &F, join: &J) -> R
where
    T: Send + Sync,
    R: Send,
    F: Fn(&mut [T], &[T], Bufs<'_, T>) -> R + Sync,
    J: Fn(R, R) -> R + Sync,
{
    let n = p.len();
    if n <= CHUNK {
        return f(p, g, b);
    }
    let mid = ((n / 2) / CHUNK).max(1) * CHUNK;
    let (p0, p1) = p.split_at_mut(mid);
    let (g0, g1) = g.split_at(mid.min(g.len()));
    let [x, y, z] = b;
    let (x0, x1) = split(x, mid);
    let (y0, y1) = split(y, mid);
    let (z0, z1) = split(z, mid);
    let (r0, r1) = rayon::join(
        || fused(p0, g0, [x0, y0, z0], f, join),
        || fused(p1, g1, [x1, y1, z1], f, join),
    );
    join(r0, r1)
}

fn split<T>(s: &mut [T], mid: usize) -> (&mut [T], &mut [T]) {
    if s.is_empty() {
        (Default::default(), Default::default())
    } else {
        s.split_at_mut(mid)
    }
}

/// Runs an update `f` that returns nothing over the buffers (see [`fused`]).
pub(crate) fn update<T: Send + Sync>(
    p: &mut [T],
    g: &[T],
    b: Bufs<'_, T>,
    f: &(impl Fn(&mut [T], &[T], Bufs<'_, T>) + Sync),
) {
    fused(p, g, b, f, &|(), ()| ());
}

/// Σ f(x) over `x` in f64, split and summed in a fixed tree.
pub(crate) fn sum_by<T: FloatElement>(x: &[T], f: &(impl Fn(f64) -> f64 + Sync)) -> f64 {
    if x.len() <= CHUNK {
        return x.iter().map(|v| f(v.to_f64())).sum();
    }
    let mid = ((x.len() / 2) / CHUNK).max(1) * CHUNK;
    let (a, b) = x.split_at(mid);
    let (l, r) = rayon::join(|| sum_by(a, f), || sum_by(b, f));
    l + r
}

/// Σ x² in f64 (the squared L2 norm), split and summed in a fixed tree.
pub(crate) fn sum_sq<T: FloatElement>(x: &[T]) -> f64 {
    sum_by(x, &|v| v * v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_every_element_once_with_their_buffers() {
        for n in [0, 1, CHUNK, CHUNK + 1, 3 * CHUNK + 7] {
            let mut p = vec![0.0f64; n];
            let g: Vec<f64> = (0..n).map(|i| i as f64).collect();
            let mut m = vec![1.0f64; n];
            let count = fused(
                &mut p,
                &g,
                [&mut m[..], &mut [], &mut []],
                &|p, g, [m, v, w]| {
                    assert!(v.is_empty() && w.is_empty());
                    assert_eq!((p.len(), g.len()), (m.len(), m.len()));
                    for ((p, g), m) in p.iter_mut().zip(g).zip(m.iter_mut()) {
                        *p += g + *m;
                        *m = 0.0;
                    }
                    p.len()
                },
                &|a, b| a + b,
            );
            assert_eq!(count, n);
            assert!(p.iter().enumerate().all(|(i, &v)| v == i as f64 + 1.0));
            assert!(m.iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn sums_of_squares_match_f64() {
        let x: Vec<f32> = (0..(2 * CHUNK + 5)).map(|i| (i % 7) as f32 - 3.0).collect();
        let naive: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
        assert_eq!(sum_sq(&x), naive);
    }
}
