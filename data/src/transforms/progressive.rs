//! Progressive resizing (FFCV's `get_resolution`): the training image size
//! as a function of the epoch.

use crate::{Error, Result};

/// A linear ramp of the image side from `min_res` to `max_res` between
/// `start_ramp` and `end_ramp`, in steps of 32 pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressiveResize {
    /// The side up to `start_ramp`.
    pub min_res: usize,
    /// The side from `end_ramp` on.
    pub max_res: usize,
    /// The last epoch at `min_res`.
    pub start_ramp: u64,
    /// The first epoch at `max_res`.
    pub end_ramp: u64,
}

impl ProgressiveResize {
    /// A schedule; errors when `end_ramp <= start_ramp` or `min_res > max_res`.
    pub fn new(min_res: usize, max_res: usize, start_ramp: u64, end_ramp: u64) -> Result<Self> {
        if end_ramp <= start_ramp || min_res > max_res {
            return Err(Error::arg(
                "ProgressiveResize::new",
                format!("needs start_ramp < end_ramp and min_res <= max_res, got {start_ramp}..{end_ramp}, {min_res}..{max_res}"),
            ));
        }
        Ok(ProgressiveResize {
            min_res,
            max_res,
            start_ramp,
            end_ramp,
        })
    }

    /// The side for `epoch`: `min_res` up to `start_ramp`, `max_res` from
    /// `end_ramp`, else `round(interp/32)·32` (NumPy's round, ties to even).
    pub fn resolution(&self, epoch: u64) -> usize {
        if epoch <= self.start_ramp {
            return self.min_res;
        }
        if epoch >= self.end_ramp {
            return self.max_res;
        }
        let t = (epoch - self.start_ramp) as f64 / (self.end_ramp - self.start_ramp) as f64;
        let r = self.min_res as f64 + t * (self.max_res as f64 - self.min_res as f64);
        (r / 32.0).round_ties_even() as usize * 32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ffcv_rn50_schedule() {
        // rn50 88-epoch config: 160 → 192 over epochs 65 → 76.
        let s = ProgressiveResize::new(160, 192, 65, 76).unwrap();
        let res: Vec<usize> = [0, 65, 66, 70, 71, 72, 75, 76, 88]
            .iter()
            .map(|&e| s.resolution(e))
            .collect();
        // 70: 160 + 32·5/11 = 174.5 → 5.45 → 160; 71: 177.5 → 5.55 → 192.
        assert_eq!(res, vec![160, 160, 160, 160, 192, 192, 192, 192, 192]);
        assert!(ProgressiveResize::new(160, 192, 5, 5).is_err());
    }
}
