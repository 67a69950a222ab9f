//! [`PipelineEngine`]: runs any [`Schedule`] on one stage with real
//! autograd. Activations travel forward and gradients backward through the
//! pipeline group's point-to-point messages (any backend), the gradients of
//! the micro-batches are summed in micro-batch order, tied weights are
//! reduced over the stages that hold them, and the data-parallel group's
//! all-reduce averages the gradients before the optimizer step.
//!
//! The data-parallel axis is DDP's reducer (`ddp::reducer`): the stage's
//! backward passes accumulate into its buckets as under `no_sync`, and the
//! stage's last backward pass of the batch launches each bucket's
//! all-reduce from the gradient hooks as soon as its gradients are final,
//! overlapping the rest of that pass (Megatron's `disable_grad_sync` until
//! the last micro-batch, with `overlap_grad_reduce`).
//!
//! Mixed precision is PyTorch's recipe per stage: forward passes and the
//! loss under `autocast` ([`PipelineEngine::with_autocast`]), activations and
//! their gradients travelling in the dtype the layers produced (half the
//! bytes under bf16/f16, as DeepSpeed and Megatron send them), and for f16
//! a [`GradScaler`] whose inf/NaN verdict is all-reduced over the pipeline
//! group, so every stage takes or skips the step together
//! ([`PipelineEngine::train_batch_scaled`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_autograd::{autocast, GradModeGuard, Gradients, Parameter, Var};
use tessera_nn::Module;
use tessera_optim::{GradAccumulator, GradScaler, Optimizer};
use tessera_tensor::{DType, MemoryMeter, Tensor};

use super::instr::{Instr, Schedule, ScheduleKind};
use super::module::PipelineStage;
use crate::comm::{CommExt, Communicator};
use crate::ddp::reducer::{self, local_backward, lock, synced_backward, Reducer};
use crate::ddp::{DdpStepStats, DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_BYTES};
use crate::element::ReduceOp;
use crate::error::{CommError, Result};

/// The loss of the last virtual stage: `(output, targets) → scalar loss`
/// of one micro-batch (mean-reduced, as PyTorch's losses are by default).
pub type LossFn = Box<dyn Fn(&Var, &Tensor) -> tessera_tensor::Result<Var> + Send + Sync>;

/// What one [`PipelineEngine::train_batch`] did on this stage.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// The batch's loss (the mean of the micro-batch losses) on the stage
    /// that holds the last layer; `None` elsewhere.
    pub loss: Option<f64>,
    /// The most micro-batch chunks whose activations this stage held at
    /// once (stashed between their forward and backward): what the
    /// schedule's [`Schedule::peak_in_flight`] says, measured.
    pub peak_stashed: usize,
    /// This stage's activation memory measured through the allocator: the
    /// most bytes of tensor storage that this stage's passes and messages
    /// allocated during the batch and held at once (stashed activations,
    /// received tensors, tensors waiting to be sent, gradients being
    /// accumulated), counted by a [`tessera_tensor::MemoryMeter`] per stage,
    /// so stages that are threads of one process are told apart.
    pub peak_activation_bytes: usize,
    /// Time spent in forward and backward passes.
    pub busy: Duration,
    /// When the batch started on this stage.
    pub started: Instant,
    /// When this stage's last forward or backward pass ended (before the
    /// gradient reductions and the optimizer step).
    pub finished: Instant,
    /// With a data-parallel axis, what its gradient reduction measured
    /// (buckets, bytes, the communication hidden behind the last backward
    /// pass); `None` without one.
    pub data_parallel: Option<DdpStepStats>,
    /// Whether the optimizer stepped: false only when the loss scaler of
    /// [`PipelineEngine::train_batch_scaled`] found an inf or NaN gradient
    /// on some stage, and then every stage skipped.
    pub stepped: bool,
}

/// Runs one stage of a pipeline: this rank's [`PipelineStage`] under a
/// [`Schedule`], over the pipeline group `comm` (rank = stage).
pub struct PipelineEngine<'c> {
    comm: &'c dyn Communicator,
    dp: Option<&'c dyn Communicator>,
    /// DDP's reducer over this stage's trainable parameters, made at the
    /// first batch with a data-parallel axis.
    reducer: Option<Arc<Mutex<Reducer>>>,
    schedule: Schedule,
    stage: PipelineStage,
    loss: LossFn,
    ties: Vec<Tie>,
    /// The dtype forward passes and the loss autocast to.
    autocast: Option<DType>,
}

/// A weight held by several stages (a shared embedding), with the group of
/// those stages.
struct Tie {
    param: Parameter,
    group: Box<dyn Communicator>,
}

impl<'c> PipelineEngine<'c> {
    /// The engine of stage `stage.stage()` running `schedule` over the
    /// pipeline group `comm`, with `loss` applied on the last virtual
    /// stage. Errors when the group size is not the schedule's stage count,
    /// when this rank is not the stage's index, or when the stage holds a
    /// different number of chunks than the schedule runs.
    pub fn new(
        comm: &'c dyn Communicator,
        schedule: Schedule,
        stage: PipelineStage,
        loss: LossFn,
    ) -> Result<Self> {
        schedule.check()?;
        let (p, v) = (schedule.stages(), schedule.chunks());
        if comm.world_size() != p
            || stage.stages() != p
            || comm.rank() != stage.stage()
            || stage.chunks().len() != v
        {
            return Err(CommError::arg(
                "PipelineEngine::new",
                format!(
                    "rank {} of a group of {} runs stage {} of {} with {} chunks, but the schedule has {p} stages of {v} chunks",
                    comm.rank(),
                    comm.world_size(),
                    stage.stage(),
                    stage.stages(),
                    stage.chunks().len()
                ),
            ));
        }
        Ok(PipelineEngine {
            comm,
            dp: None,
            reducer: None,
            schedule,
            stage,
            loss,
            ties: Vec::new(),
            autocast: None,
        })
    }

    /// Averages the gradients over the data-parallel group `dp` (the ranks
    /// that hold the same stage) before each optimizer step, so that a
    /// `pp × dp` grid trains as one process on the concatenated batches.
    /// The reduction is DDP's: gradients in buckets of PyTorch's default
    /// sizes, all-reduced from the hooks of the stage's last backward pass
    /// of each batch (see [`StepReport::data_parallel`]). The ranks of `dp`
    /// must start from the same parameters.
    pub fn with_data_parallel(mut self, dp: &'c dyn Communicator) -> Self {
        self.dp = Some(dp);
        self.reducer = None;
        self
    }

    /// Runs every forward pass and the loss under `autocast(dtype, ..)`
    /// (PyTorch's mixed precision: matmul/linear/conv in `dtype`, norms,
    /// softmax and losses in f32, parameters and their gradients f32). Every
    /// stage of a pipeline must be given the same dtype. Errors unless
    /// `dtype` is bf16 or f16.
    pub fn with_autocast(mut self, dtype: DType) -> Result<Self> {
        if !matches!(dtype, DType::BF16 | DType::F16) {
            return Err(CommError::arg(
                "PipelineEngine::with_autocast",
                format!("autocast runs in bf16 or f16, got {dtype}"),
            ));
        }
        self.autocast = Some(dtype);
        Ok(self)
    }

    /// Ties a weight held by the stages `stages` (DeepSpeed's
    /// `TiedLayerSpec`: a shared input/output embedding on the first and
    /// last stage): their copies start from the first listed stage's value,
    /// and their gradients are summed over those stages before every
    /// optimizer step. A collective over the pipeline group: every stage
    /// calls it with the same `stages`, in the same order of ties, passing
    /// its copy when it is listed and `None` otherwise. Errors when a listed
    /// stage passes `None` (or an unlisted one a parameter), when a stage
    /// index is out of range, and on communication failures.
    pub fn tie(&mut self, stages: &[usize], param: Option<Parameter>) -> Result<()> {
        const OP: &str = "PipelineEngine::tie";
        let me = self.stage.stage();
        let listed = stages.contains(&me);
        if stages.iter().any(|&s| s >= self.schedule.stages()) || listed != param.is_some() {
            return Err(CommError::arg(
                OP,
                format!(
                    "stage {me} passes {} a parameter for a tie over stages {stages:?} of {}",
                    if param.is_some() { "" } else { "no" },
                    self.schedule.stages()
                ),
            ));
        }
        let key = stages.iter().position(|&s| s == me).unwrap_or(0) as i64;
        let group = self.comm.split(listed.then_some(0), key)?;
        if let (Some(group), Some(param)) = (group, param) {
            let synced = group.broadcast(&param.tensor()?, 0)?;
            param.set(synced)?;
            self.ties.push(Tie { param, group });
        }
        Ok(())
    }

    /// This rank's stage.
    pub fn stage(&self) -> &PipelineStage {
        &self.stage
    }

    /// The schedule it runs.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Trains on one batch: `inputs` (read on stage 0) and `targets` (read
    /// on the last stage) are split along dim 0 into the schedule's
    /// micro-batches, each micro-batch's loss is scaled by `1/m`, the
    /// gradients are summed over the micro-batches, reduced over tied
    /// stages and the data-parallel group, and `opt` (over this stage's
    /// parameters) takes one step. Errors, naming the stage, the
    /// instruction and its micro-batch, when a layer or the loss fails (a
    /// shape mismatch between stages), when dim 0 does not split into the
    /// micro-batches, when a peer is gone or silent past the communicator's
    /// timeout, and when the schedule does not train.
    pub fn train_batch(
        &mut self,
        inputs: &Tensor,
        targets: &Tensor,
        opt: &mut dyn Optimizer,
    ) -> Result<StepReport> {
        self.train(inputs, targets, opt, None)
    }

    /// [`PipelineEngine::train_batch`] with dynamic loss scaling (f16 mixed
    /// precision, `torch.amp.GradScaler`'s recipe): each micro-batch's loss
    /// is backpropagated times the scale S, and the step goes through
    /// `scaler`, which divides the gradients by S and skips the step when
    /// one holds an inf or NaN. The verdict is all-reduced over the
    /// pipeline group (a data-parallel axis averages inf/NaN into every
    /// replica's gradients already), so all stages step or skip together;
    /// [`StepReport::stepped`] says which. Call `scaler.update()` after, as
    /// in PyTorch. Every stage must pass a scaler in the same state. Errors
    /// as `train_batch`, as the scaler's `unscale_`/`step`, and when the
    /// flag's all-reduce fails.
    pub fn train_batch_scaled(
        &mut self,
        inputs: &Tensor,
        targets: &Tensor,
        opt: &mut dyn Optimizer,
        scaler: &mut GradScaler,
    ) -> Result<StepReport> {
        self.train(inputs, targets, opt, Some(scaler))
    }

    /// One training batch, with or without a loss scaler.
    fn train(
        &mut self,
        inputs: &Tensor,
        targets: &Tensor,
        opt: &mut dyn Optimizer,
        scaler: Option<&mut GradScaler>,
    ) -> Result<StepReport> {
        self.check_trains()?;
        self.prepare_reducer()?;
        let mut run = Run::new(self, inputs, targets)?;
        self.execute(&mut run, Some(opt), scaler)?;
        Ok(run.report())
    }

    /// Runs the inference schedule on one batch (forward only, no graph
    /// recorded): returns the last stage's outputs of every micro-batch
    /// concatenated along dim 0, `None` on the other stages. Errors as
    /// [`PipelineEngine::train_batch`], and when the schedule is not the
    /// inference schedule.
    pub fn infer_batch(&mut self, inputs: &Tensor) -> Result<Option<Tensor>> {
        if self.schedule.kind() != ScheduleKind::Inference {
            return Err(CommError::arg(
                "PipelineEngine::infer_batch",
                format!(
                    "needs the inference schedule, not {}",
                    self.schedule.kind().name()
                ),
            ));
        }
        let _guard = GradModeGuard::set(false);
        let mut run = Run::new(self, inputs, inputs)?;
        self.execute(&mut run, None, None)?;
        if run.results.is_empty() {
            return Ok(None);
        }
        let outs: Vec<Tensor> = (0..self.schedule.micro_batches())
            .map(|mb| run.results.remove(&mb).expect("the last stage ran every forward"))
            .collect();
        Ok(Some(Tensor::cat(&outs, 0)?))
    }

    fn check_trains(&self) -> Result<()> {
        if !self.schedule.kind().trains() {
            return Err(CommError::arg(
                "PipelineEngine::train_batch",
                "the inference schedule has no backward; use infer_batch",
            ));
        }
        Ok(())
    }

    /// Makes the data-parallel reducer at the first batch, and empties its
    /// buckets before every batch.
    fn prepare_reducer(&mut self) -> Result<()> {
        if let (Some(dp), None) = (self.dp, &self.reducer) {
            let named = self.stage.named_parameters();
            self.reducer = Some(reducer::all_reduce_reducer(
                "PipelineEngine::train_batch",
                dp.world_size(),
                &named,
                DEFAULT_FIRST_BUCKET_BYTES,
                DEFAULT_BUCKET_CAP_BYTES,
            )?);
        }
        if let Some(red) = &self.reducer {
            lock(red).discard_accumulated();
        }
        Ok(())
    }

    /// Runs `f` (a forward pass or the loss) under the engine's autocast.
    fn cast<R>(&self, f: impl FnOnce() -> tessera_tensor::Result<R>) -> tessera_tensor::Result<R> {
        match self.autocast {
            Some(d) => autocast(d, f),
            None => f(),
        }
    }

    /// Runs this stage's program, in order.
    fn execute<'o>(
        &self,
        run: &mut Run<'_>,
        mut opt: Option<&mut (dyn Optimizer + 'o)>,
        mut scaler: Option<&mut GradScaler>,
    ) -> Result<()> {
        for &instr in self.schedule.instrs(self.stage.stage()) {
            // The reductions and the optimizer step are not activation memory.
            let metered = !matches!(
                instr,
                Instr::ReduceTiedGrads | Instr::ReduceGrads | Instr::OptimizerStep
            );
            let _scope = metered.then(|| run.meter.enter());
            run.exec(self, instr, opt.as_deref_mut(), scaler.as_deref_mut())
                .map_err(|e| self.wrap(&instr, e))?;
        }
        Ok(())
    }

    fn wrap(&self, instr: &Instr, e: CommError) -> CommError {
        let what = match instr.mb_chunk() {
            Some((mb, chunk)) => format!("{instr} (micro-batch {mb}, chunk {chunk})"),
            None => instr.to_string(),
        };
        CommError::Pipeline {
            stage: self.stage.stage(),
            instr: what,
            source: Box::new(e),
        }
    }

    /// Whether this stage holds the first / the last virtual stage.
    fn ends(&self) -> (bool, bool) {
        let s = self.stage.stage();
        (s == 0, s + 1 == self.schedule.stages())
    }
}

/// The state of one batch on one stage.
struct Run<'t> {
    inputs: &'t Tensor,
    targets: &'t Tensor,
    micro: usize,
    loaded: HashMap<usize, (Option<Tensor>, Option<Tensor>)>,
    received: HashMap<(usize, usize), Tensor>,
    to_send: HashMap<(usize, usize), Tensor>,
    stash: HashMap<(usize, usize), (Var, Var)>,
    results: HashMap<usize, Tensor>,
    acc: GradAccumulator,
    grads: Option<Gradients>,
    /// Backward passes left on this stage in this batch.
    backwards_left: usize,
    data_parallel: Option<DdpStepStats>,
    loss: f64,
    has_loss: bool,
    stepped: bool,
    peak: usize,
    meter: MemoryMeter,
    busy: Duration,
    started: Instant,
    finished: Instant,
}

impl<'t> Run<'t> {
    fn new(e: &PipelineEngine<'_>, inputs: &'t Tensor, targets: &'t Tensor) -> Result<Self> {
        let m = e.schedule.micro_batches();
        let (first, last) = e.ends();
        let mut micro = 0;
        let trains = e.schedule.kind().trains();
        for (t, used, what) in [(inputs, first, "inputs"), (targets, last && trains, "targets")] {
            if !used {
                continue;
            }
            let rows = t.shape().first().copied().unwrap_or(0);
            if rows == 0 || rows % m != 0 {
                return Err(CommError::Pipeline {
                    stage: e.stage.stage(),
                    instr: "Load".into(),
                    source: Box::new(CommError::arg(
                        "PipelineEngine",
                        format!(
                            "{what} of shape {:?} do not split into {m} equal micro-batches along dim 0",
                            t.shape()
                        ),
                    )),
                });
            }
            micro = rows / m;
        }
        let now = Instant::now();
        Ok(Run {
            inputs,
            targets,
            micro,
            loaded: HashMap::new(),
            received: HashMap::new(),
            to_send: HashMap::new(),
            stash: HashMap::new(),
            results: HashMap::new(),
            acc: GradAccumulator::new(m * e.schedule.chunks(), false)?,
            grads: None,
            backwards_left: m * e.schedule.chunks(),
            data_parallel: None,
            loss: 0.0,
            has_loss: false,
            stepped: true,
            peak: 0,
            meter: MemoryMeter::new(),
            busy: Duration::ZERO,
            started: now,
            finished: now,
        })
    }

    fn report(&self) -> StepReport {
        StepReport {
            loss: self.has_loss.then_some(self.loss),
            peak_stashed: self.peak,
            peak_activation_bytes: self.meter.peak_bytes(),
            busy: self.busy,
            started: self.started,
            finished: self.finished,
            data_parallel: self.data_parallel.clone(),
            stepped: self.stepped,
        }
    }

    fn exec<'o>(
        &mut self,
        e: &PipelineEngine<'_>,
        instr: Instr,
        opt: Option<&mut (dyn Optimizer + 'o)>,
        scaler: Option<&mut GradScaler>,
    ) -> Result<()> {
        let s = e.stage.stage();
        let last_k = e.schedule.virtual_stages() - 1;
        match instr {
            Instr::Load { mb } => {
                let (first, last) = e.ends();
                let slice = |t: &Tensor| t.narrow(0, mb * self.micro, self.micro);
                let x = if first { Some(slice(self.inputs)?) } else { None };
                let y = if last && e.schedule.kind().trains() {
                    Some(slice(self.targets)?)
                } else {
                    None
                };
                self.loaded.insert(mb, (x, y));
            }
            Instr::RecvAct { mb, chunk } | Instr::RecvGrad { mb, chunk } => {
                let route = e.schedule.route(s, &instr).expect("checked schedule");
                let t = e.comm.recv_tensor(route.peer, route.msg.tag())?;
                self.received.insert((mb, chunk), t);
            }
            Instr::SendAct { mb, chunk } | Instr::SendGrad { mb, chunk } => {
                let route = e.schedule.route(s, &instr).expect("checked schedule");
                let t = self
                    .to_send
                    .remove(&(mb, chunk))
                    .expect("checked schedule: sent after its pass");
                e.comm.send_tensor(&t, route.peer, route.msg.tag())?;
            }
            Instr::Fwd { mb, chunk } => {
                let t0 = Instant::now();
                let k = e.schedule.virtual_stage(s, chunk);
                let x = if k == 0 {
                    let input = self.loaded.get(&mb).and_then(|l| l.0.clone());
                    Var::constant(input.expect("checked schedule: loaded before its forward"))
                } else {
                    let t = self.received.remove(&(mb, chunk)).expect("checked schedule");
                    if e.schedule.kind().trains() {
                        Var::leaf(t)
                    } else {
                        Var::constant(t)
                    }
                };
                let y = e.cast(|| e.stage.chunks()[chunk].forward(&x))?;
                if k == last_k && e.schedule.kind().trains() {
                    let target = self.loaded.get_mut(&mb).and_then(|l| l.1.take());
                    let target = target.expect("checked schedule: loaded before its forward");
                    let loss = e.cast(|| (e.loss)(&y, &target))?;
                    let loss = loss.mul_scalar(1.0 / e.schedule.micro_batches() as f64)?;
                    self.loss += loss
                        .tensor()
                        .to_dtype(tessera_tensor::DType::F64)?
                        .to_scalar::<f64>()?;
                    self.has_loss = true;
                    self.stash.insert((mb, chunk), (x, loss));
                } else if k == last_k {
                    self.results.insert(mb, y.into_tensor());
                } else {
                    self.to_send.insert((mb, chunk), y.tensor().clone());
                    if e.schedule.kind().trains() {
                        self.stash.insert((mb, chunk), (x, y));
                    }
                }
                self.peak = self.peak.max(self.stash.len());
                self.pass_done(t0);
            }
            Instr::Bwd { mb, chunk } => {
                let t0 = Instant::now();
                let k = e.schedule.virtual_stage(s, chunk);
                let (x, y) = self.stash.remove(&(mb, chunk)).expect("checked schedule");
                let dy = if k == last_k {
                    None
                } else {
                    Some(self.received.remove(&(mb, chunk)).expect("checked schedule"))
                };
                let scaler = scaler.as_deref();
                let backward = || match (&dy, scaler) {
                    (None, Some(scaler)) => scaler.backward(&y),
                    (None, None) => y.backward(),
                    (Some(dy), _) => y.backward_with(dy),
                };
                self.backwards_left -= 1;
                let mut grads = match (&e.reducer, e.dp) {
                    (Some(red), Some(dp)) => self.reduced_backward(e, red, dp, backward)?,
                    _ => backward()?,
                };
                if k > 0 {
                    let dx = match grads.remove(&x) {
                        Some(g) => g,
                        None => x.tensor().zeros_like(None)?,
                    };
                    self.to_send.insert((mb, chunk), dx);
                }
                if e.reducer.is_none() {
                    if let Some(sum) = self.acc.add(grads)? {
                        self.grads = Some(sum);
                    }
                }
                self.pass_done(t0);
            }
            Instr::ReduceTiedGrads => {
                let grads = self.grads.get_or_insert_with(Gradients::default);
                for tie in &e.ties {
                    let g = grad_or_zeros(grads, &tie.param)?;
                    let sum = tie.group.all_reduce(&g, ReduceOp::Sum)?;
                    insert(grads, &tie.param, sum);
                }
            }
            Instr::ReduceGrads => {
                // With a data-parallel axis the reduction ran from the
                // hooks of the last backward pass (its gradients are in
                // `grads` already); this instruction only marks its place.
                if e.dp.is_some() && self.data_parallel.is_none() {
                    return Err(CommError::arg(
                        "PipelineEngine",
                        "the data-parallel reduction did not run before ReduceGrads",
                    ));
                }
            }
            Instr::OptimizerStep => {
                let mut grads = self.grads.take().unwrap_or_default();
                match (opt, scaler) {
                    (Some(opt), Some(scaler)) => {
                        scaler.unscale_across(&mut grads, &mut |local| {
                            crate::comm::any_rank(e.comm, local, "PipelineEngine::train_batch_scaled")
                        })?;
                        self.stepped = scaler.step(opt, &mut grads)?;
                    }
                    (Some(opt), None) => opt.step(&grads)?,
                    (None, _) => {}
                }
            }
        }
        Ok(())
    }

    /// Runs a backward pass through the data-parallel reducer: the stage's
    /// last backward of the batch all-reduces the buckets (overlapping the
    /// pass) and installs the averaged gradients in `grads`; the others
    /// only accumulate. Parameters a pass does not reach (another chunk's)
    /// count as contributing zero. Returns the pass's gradients (for the
    /// input's gradient).
    fn reduced_backward(
        &mut self,
        e: &PipelineEngine<'_>,
        red: &Mutex<Reducer>,
        dp: &dyn Communicator,
        backward: impl FnOnce() -> tessera_tensor::Result<Gradients>,
    ) -> Result<Gradients> {
        if self.backwards_left > 0 {
            return local_backward(red, true, backward);
        }
        let (grads, stats) = synced_backward(red, dp, true, true, backward)?;
        let red = lock(red);
        let mut averaged = Gradients::default();
        for (i, p) in e
            .stage
            .parameters()
            .iter()
            .filter(|p| p.requires_grad())
            .enumerate()
        {
            if let (Some(id), Some(g)) = (p.id(), red.grad_view(i, &p.shape())?) {
                averaged.insert(id, g);
            }
        }
        self.grads = Some(averaged);
        self.data_parallel = Some(stats);
        Ok(grads)
    }

    fn pass_done(&mut self, t0: Instant) {
        self.finished = Instant::now();
        self.busy += self.finished - t0;
    }
}

/// The gradient of `p`, or zeros when no micro-batch reached it (every rank
/// of a reduction must contribute a buffer of the same size).
fn grad_or_zeros(grads: &Gradients, p: &Parameter) -> Result<Tensor> {
    match p.grad(grads) {
        Some(g) => Ok(g.clone()),
        None => Ok(p.tensor()?.zeros_like(None)?),
    }
}

fn insert(grads: &mut Gradients, p: &Parameter, g: Tensor) {
    if let Some(id) = p.id() {
        grads.insert(id, g);
    }
}
