//! 1-bit Adam (Tang et al. 2021; DeepSpeed `onebit/adam.py`, spec §4.2).

use tessera_autograd::{Gradients, Parameter};
use tessera_tensor::{Result, StateDict, Tensor};

use super::slots::{apply_mask, group_accessors, mask_low_variance, Factors, OnebitOptions, Slots};
use super::{CompressedReducer, ErrorFeedback, WireStats};
use crate::{Optimizer, ParamGroup};

/// 1-bit Adam: exact Adam during a warm-up of `freeze_step` steps, then the
/// variance is frozen and only the momentum is exchanged, compressed to one
/// bit per element with error feedback.
///
/// DeepSpeed's form, without bias correction and with ε outside the root:
///
/// ```text
/// warm-up (g averaged over the ranks):  m ← β1m + (1−β1)g ;  v ← β2v + (1−β2)g²
/// compression (g local):                m ← compressed_all_reduce(β1m + (1−β1)g) ⊙ mask
/// u = m / (√v + ε) + λθ ;  θ ← θ − γu
/// ```
///
/// The freeze happens after the step whose count reaches `freeze_step`;
/// from then [`Optimizer::wants_averaged_grads`] is false and `step` takes
/// this rank's local gradients. Without a reducer (a single process) the
/// compressed exchange is skipped, as DeepSpeed skips it for one rank.
///
/// # Coordinates whose variance is (nearly) 0: the automatic mask
///
/// After the freeze each coordinate moves by `γ·m/(√v+ε)` with `m` the
/// compressed momentum, which is never 0: 1-bit compression sends every
/// element as `±s`, `s` the root mean square of its chunk. A coordinate
/// whose gradient was (nearly) always 0 during the warm-up, such as a
/// weight of a ReLU unit that has not fired yet, has `√v ≈ 0` and takes
/// steps of about `γ·s/ε` (ε = 1e-8). A PyTorch re-implementation of
/// spec §4.2 (`scripts/onebit_adam_mnist_freeze.py`: the MNIST CNN, two
/// simulated ranks, `train_mnist`'s one-cycle schedule) frozen at step 40
/// has 7% of the first linear layer's weights at `√v < 10⁻⁶`; they jump to
/// ±20–600 on the first compressed step and the loss is NaN 6 steps later.
/// DeepSpeed does the same: its answer is a user-supplied `exp_avg_mask`
/// ([`OnebitAdam::set_exp_avg_mask`]), which needs the user to know which
/// coordinates will be 0.
///
/// So, by default, the mask is also built from the frozen variance: after
/// each compressed exchange the momentum is zeroed wherever
/// `v ≤ r²·mean(v)` over the parameter, `r` =
/// [`crate::DEFAULT_VARIANCE_MASK`] (0.01; [`OnebitAdam::with_variance_mask`]
/// changes it, `None` restores DeepSpeed's behaviour). Exact Adam leaves
/// such a coordinate (nearly) where it is, since its momentum is 0 with
/// its gradient; masked, it stays where the freeze left it (weight decay
/// still applies). The variance is built from averaged gradients, so the
/// mask is the same on every rank and the ranks stay bitwise equal. It
/// changes nothing before the freeze, on one process (nothing is
/// compressed) or where no variance is that small. The price: a unit that
/// was dead through the warm-up cannot come alive afterwards, which a
/// frozen variance of 0 could not have trained anyway. With it, the
/// PyTorch script frozen at step 40 trains on (see the script's
/// docstring), and `train_mnist --ddp --optim onebit-adam` reaches Adam's
/// accuracy (README). The variance is also not bias-corrected, so a short
/// warm-up freezes it small (`1−β2^t` of its scale) and every later step
/// is that much longer: Tang et al. warm up for 15–25% of training.
///
/// Unlike DeepSpeed, the first `step` is a real step: DeepSpeed's first
/// call is a dry run that only allocates its buffers (spec §4.2's
/// decision). A checkpoint load zeroes the error buffers and sets the
/// freeze from the saved step; exp-avg masks are not saved (they come from
/// the caller, as in DeepSpeed).
pub struct OnebitAdam<'r> {
    slots: Slots<'r>,
    freeze_step: u64,
    frozen: bool,
}

const BUFFERS: &[&str] = &["exp_avg", "exp_avg_sq"];

impl<'r> OnebitAdam<'r> {
    /// 1-bit Adam over one group of f32 `params`, freezing the variance
    /// after `freeze_step` steps (DeepSpeed's default is 100000; `u64::MAX`
    /// never freezes). Errors when a hyperparameter is out of its domain, a
    /// parameter is listed twice or is not f32.
    pub fn new(params: Vec<Parameter>, hyper: OnebitOptions, freeze_step: u64) -> Result<Self> {
        Self::with_groups(vec![ParamGroup::new(params, hyper)], freeze_step)
    }

    /// 1-bit Adam over parameter groups. Errors as [`OnebitAdam::new`].
    pub fn with_groups(groups: Vec<ParamGroup<OnebitOptions>>, freeze_step: u64) -> Result<Self> {
        Ok(OnebitAdam {
            slots: Slots::new("OnebitAdam", groups)?,
            freeze_step,
            frozen: false,
        })
    }

    /// Exchanges the momentum through `reducer` after the warm-up (every
    /// data-parallel rank builds its optimizer with a reducer of one group).
    pub fn with_reducer(mut self, reducer: impl CompressedReducer + 'r) -> Self {
        self.slots.reducer = Some(Box::new(reducer));
        self
    }

    /// Multiplies `param`'s momentum by `mask` after every compressed
    /// exchange (DeepSpeed's `exp_avg_mask`): 1-bit compression cannot
    /// encode 0, so rows that must stay zero (unused embedding rows) need
    /// it. Errors when `param` is not optimized here or `mask`'s shape
    /// differs from it.
    pub fn set_exp_avg_mask(&mut self, param: &Parameter, mask: &Tensor) -> Result<()> {
        self.slots.set_exp_avg_mask(param, mask)
    }

    /// Sets the automatic exp-avg mask: after each compressed exchange the
    /// momentum of every coordinate whose frozen variance is at most
    /// `ratio²` times its parameter's mean variance is zeroed (on by
    /// default with [`crate::DEFAULT_VARIANCE_MASK`]; `Some(0.0)` masks
    /// only coordinates whose gradient was exactly 0 through the warm-up;
    /// `None` is DeepSpeed's behaviour). Errors when the ratio is negative
    /// or not finite.
    pub fn with_variance_mask(mut self, ratio: Option<f64>) -> Result<Self> {
        self.slots.set_variance_mask(ratio)?;
        Ok(self)
    }

    /// True once the variance is frozen (the compression stage).
    pub fn frozen(&self) -> bool {
        self.frozen
    }

    /// The number of steps taken.
    pub fn step_count(&self) -> u64 {
        self.slots.step
    }

    /// The error feedback of parameter `index` of group `group` (empty
    /// before its first compressed exchange and after a checkpoint load).
    pub fn error_feedback(&self, group: usize, index: usize) -> Option<&ErrorFeedback> {
        Some(&self.slots.state.get(group)?.get(index)?.errors)
    }

    /// The bytes this rank sent since the last call (zeros on one process).
    pub fn take_wire_stats(&mut self) -> WireStats {
        self.slots.take_wire_stats()
    }

    /// The buffer `name` (`exp_avg`, `exp_avg_sq`) of parameter `index` of
    /// group `group`, once created.
    pub fn state_buffer(&self, group: usize, index: usize, name: &str) -> Option<&[f32]> {
        let slot = self.slots.state.get(group)?.get(index)?;
        slot.bufs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| b.as_slice())
    }
}

impl Optimizer for OnebitAdam<'_> {
    group_accessors!();

    fn wants_averaged_grads(&self) -> bool {
        !self.frozen
    }

    fn step(&mut self, grads: &Gradients) -> Result<()> {
        self.slots.check(grads)?;
        let compress = self.frozen && self.slots.world_size() > 1;
        let Slots {
            groups,
            state,
            reducer,
            masks,
            variance_mask,
            ..
        } = &mut self.slots;
        for (gi, grp) in groups.iter().enumerate() {
            let h = grp.hyper;
            let Factors {
                b1,
                w1,
                b2,
                w2,
                eps,
                wd,
            } = h.factors();
            let neg_lr = -h.lr as f32;
            for (p, slot) in grp.params.iter().zip(state[gi].iter_mut()) {
                let Some(g) = p.grad(grads) else { continue };
                let g = g.contiguous()?;
                let g = g.as_slice::<f32>()?;
                let numel = g.len();
                let ([m, v], errors) = slot.split(["exp_avg", "exp_avg_sq"], numel);
                for (mi, &gi) in m.iter_mut().zip(g) {
                    *mi = *mi * b1 + w1 * gi;
                }
                if self.frozen {
                    if compress {
                        let r = reducer.as_mut().expect("compress implies a reducer");
                        r.compressed_all_reduce(m, errors)?;
                        mask_low_variance(m, v, *variance_mask);
                    }
                    apply_mask(masks, p, m);
                } else {
                    for (vi, &gi) in v.iter_mut().zip(g) {
                        *vi = *vi * b2 + w2 * gi * gi;
                    }
                }
                let (m, v) = (&*m, &*v);
                p.update_::<f32, _>(|x| {
                    for i in 0..x.len() {
                        let mut u = m[i] / (v[i].sqrt() + eps);
                        if wd > 0.0 {
                            u += wd * x[i];
                        }
                        x[i] += neg_lr * u;
                    }
                })?;
            }
        }
        self.slots.step += 1;
        if !self.frozen && self.slots.step >= self.freeze_step {
            self.frozen = true;
        }
        Ok(())
    }

    fn state_dict(&self) -> StateDict {
        let mut sd = self.slots.state_dict();
        sd.set("freeze_step", self.freeze_step);
        sd
    }

    /// DeepSpeed's reload rules: the error buffers are zeroed, the freeze
    /// follows the saved step against this optimizer's `freeze_step`, and
    /// the masks set on this optimizer stay.
    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        let step = self.slots.load_state_dict(sd, BUFFERS, &[])?;
        self.frozen = step >= self.freeze_step;
        Ok(())
    }
}
