//! A small counter-based random generator.
//!
//! Every random decision in this crate (shuffles, random transforms, MixUp)
//! draws from an [`Rng`] whose key is derived from a user seed and the
//! coordinates of the decision — `(seed, epoch)` for a sampler's
//! permutation, `(seed, epoch, sample index)` for a per-sample transform.
//! Output number `k` of a generator is `mix64(key + (k+1)·γ)` (SplitMix64's
//! finaliser over a Weyl sequence), a pure function of the key and the
//! counter. No state is shared between samples, so the values a sample sees
//! do not depend on the number of loader workers, on which worker loads it,
//! or on the order in which workers run.

/// The golden-ratio increment of SplitMix64.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: a bijective 64-bit mixer.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A counter-based generator: `key` plus a counter of values drawn.
#[derive(Debug, Clone)]
pub struct Rng {
    key: u64,
    counter: u64,
}

impl Rng {
    /// A generator keyed by `seed` alone.
    pub fn new(seed: u64) -> Self {
        Rng {
            key: mix64(seed ^ 0x7E55_E7A0_DA7A_0001),
            counter: 0,
        }
    }

    /// A generator keyed by a seed and any number of coordinates (epoch,
    /// sample index, rank, worker, ...). Different coordinate tuples give
    /// independent-looking streams.
    pub fn keyed(seed: u64, coords: &[u64]) -> Self {
        let mut key = mix64(seed ^ 0x7E55_E7A0_DA7A_0001);
        for &c in coords {
            key = mix64(key ^ mix64(c.wrapping_add(GAMMA)));
        }
        Rng { key, counter: 0 }
    }

    /// The generator for sample `index` in `epoch` under `seed`: what
    /// per-sample random transforms use.
    pub fn for_sample(seed: u64, epoch: u64, index: u64) -> Self {
        Self::keyed(seed, &[epoch, index])
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.counter = self.counter.wrapping_add(1);
        mix64(self.key.wrapping_add(self.counter.wrapping_mul(GAMMA)))
    }

    /// A uniform value in `[0, 1)` with 53 random bits.
    #[inline]
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform value in `[lo, hi)`.
    pub fn uniform_range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// A uniform integer in `0 .. n` (unbiased: Lemire's multiply-shift with
    /// rejection); 0 when `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = (self.next_u64() as u128) * (n as u128);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// True with probability `p`.
    pub fn bernoulli(&mut self, p: f64) -> bool {
        self.uniform() < p
    }

    /// A standard normal value (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// A Gamma(`shape`, 1) value (Marsaglia–Tsang; boosted for shape < 1).
    /// `shape` must be positive.
    pub fn gamma(&mut self, shape: f64) -> f64 {
        if shape < 1.0 {
            let u = 1.0 - self.uniform();
            return self.gamma(shape + 1.0) * u.powf(1.0 / shape);
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = 1.0 - self.uniform();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }

    /// A Beta(`a`, `b`) value in `[0, 1]`; `a` and `b` must be positive.
    pub fn beta(&mut self, a: f64, b: f64) -> f64 {
        let x = self.gamma(a);
        let y = self.gamma(b);
        if x + y == 0.0 {
            0.5
        } else {
            x / (x + y)
        }
    }

    /// Shuffles `v` in place (Fisher–Yates, from the back).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }

    /// A uniformly random permutation of `0 .. n`.
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        self.shuffle(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_stream_and_coords_matter() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut r = Rng::for_sample(1, 2, 3);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = Rng::for_sample(1, 2, 3);
        assert_eq!(a, (0..8).map(|_| r.next_u64()).collect::<Vec<_>>());
        let mut r = Rng::for_sample(1, 3, 2);
        assert_ne!(a, (0..8).map(|_| r.next_u64()).collect::<Vec<_>>());
    }

    #[test]
    fn below_is_uniform_and_in_range() {
        let mut r = Rng::new(7);
        let mut counts = [0usize; 6];
        for _ in 0..60_000 {
            counts[r.below(6) as usize] += 1;
        }
        for c in counts {
            assert!((9_400..10_600).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn beta_moments() {
        let mut r = Rng::new(3);
        let (a, b) = (0.8, 0.8);
        let n = 40_000;
        let xs: Vec<f64> = (0..n).map(|_| r.beta(a, b)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        let want_var = a * b / ((a + b).powi(2) * (a + b + 1.0));
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        assert!((var - want_var).abs() < 0.01, "var {var} vs {want_var}");
        assert!(xs.iter().all(|x| (0.0..=1.0).contains(x)));
    }

    #[test]
    fn permutation_is_a_permutation() {
        let mut p = Rng::new(1).permutation(1000);
        assert_ne!(p, (0..1000).collect::<Vec<_>>());
        p.sort_unstable();
        assert_eq!(p, (0..1000).collect::<Vec<_>>());
    }
}
