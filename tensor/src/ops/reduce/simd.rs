//! f32 reducers on the SIMD kernels: sum (also behind mean) and max/min.
//! Contiguous row segments go through [`crate::simd::kernels`], whose
//! accumulation order depends only on the segment length; the engine's fixed
//! chunking keeps the whole reduction independent of the thread count.

use super::cpu::{row_sum, Reducer};
use crate::simd::{kernels, Level};
use crate::FloatMath;

/// Σ x over f32, with the SIMD sum on contiguous segments.
pub(crate) struct SumF32(pub Level);

impl Reducer<f32> for SumF32 {
    type Acc = f32;
    fn init(&self) -> f32 {
        0.0
    }
    fn fold(&self, acc: &mut f32, src: &[f32], off: usize, stride: isize, len: usize, _: usize) {
        *acc += if stride == 1 {
            kernels::sum(self.0, &src[off..off + len])
        } else {
            row_sum(src, off, stride, len, |x| x)
        };
    }
    fn merge(&self, a: f32, b: f32) -> f32 {
        a + b
    }
}

/// max x (or min x) over f32; NaN propagates.
pub(crate) struct ExtremeF32 {
    /// The SIMD level.
    pub level: Level,
    /// Maximum instead of minimum.
    pub max: bool,
}

impl Reducer<f32> for ExtremeF32 {
    type Acc = f32;
    fn init(&self) -> f32 {
        if self.max {
            f32::NEG_INFINITY
        } else {
            f32::INFINITY
        }
    }
    fn fold(&self, acc: &mut f32, src: &[f32], off: usize, stride: isize, len: usize, _: usize) {
        let m = if stride == 1 && self.max {
            kernels::max(self.level, &src[off..off + len])
        } else {
            let mut m = self.init();
            crate::strided::read_row(src, off, stride, len, |_, x| m = self.merge(m, x));
            m
        };
        *acc = self.merge(*acc, m);
    }
    fn merge(&self, a: f32, b: f32) -> f32 {
        if self.max {
            a.max_nan(b)
        } else {
            a.min_nan(b)
        }
    }
}
