//! The pure checks every schedule must pass (spec §5.6), and the
//! in-flight (stashed activation) counts they bound.

use std::collections::HashMap;

use super::instr::{Instr, Msg, Schedule, ScheduleKind};
use super::simulate::{run_untimed, Semantics};
use crate::error::{CommError, Result};

impl Schedule {
    /// Runs the structural checks of spec §5.6 on this schedule; errors
    /// with the first violation found:
    /// 1. every stage runs the forward (and, when training, the backward)
    ///    of every (micro-batch, chunk) exactly once, and nothing else;
    /// 2. forward before backward; each input received before its pass and
    ///    each result sent after it, exactly when a neighbouring virtual
    ///    stage exists; `Load` before the first and last virtual stage's
    ///    forwards; `ReduceTiedGrads`, `ReduceGrads`, `OptimizerStep` once
    ///    each, in that order, after the last backward (none for inference);
    /// 3. the messages a stage sends to a peer are the ones the peer
    ///    receives from it, in the same order (and, for lockstep schedules,
    ///    within the same step);
    /// 4. the stages finish with buffered sends (tessera's communicators
    ///    buffer every send) and, except interleaved schedules, under
    ///    rendezvous with each step's transfers posted together (one at a
    ///    time as well for lockstep schedules, whose stage parity makes
    ///    blocking safe). Interleaved schedules need buffered sends: with
    ///    two stages, each is the other's next and previous stage, and a
    ///    gradient sent alone in one step waits for a receive the peer
    ///    posts one step later, after its own lone send (Megatron avoids
    ///    this by batching the four transfers of an F/B pair);
    /// 5. no stage holds more micro-batches than its buffers.
    pub fn check(&self) -> Result<()> {
        for s in 0..self.stages {
            self.check_stage(s)?;
        }
        self.check_matching()?;
        if self.is_lockstep() {
            self.check_lockstep()?;
        }
        run_untimed(self, Semantics::Buffered)?;
        if self.kind != ScheduleKind::Interleaved {
            run_untimed(self, Semantics::Batched)?;
        }
        if self.is_lockstep() {
            run_untimed(self, Semantics::Blocking)?;
        }
        for s in 0..self.stages {
            let (peak, bufs) = (self.peak_in_flight(s), self.num_pipe_buffers(s));
            if peak > bufs {
                return Err(bad(format!(
                    "stage {s} holds {peak} micro-batches in {bufs} buffers"
                )));
            }
        }
        Ok(())
    }

    /// The most (micro-batch, chunk) pairs stage `stage` holds between
    /// their forward and backward: the running `#Fwd − #Bwd`. For
    /// inference, where nothing waits for a backward, 0.
    pub fn peak_in_flight(&self, stage: usize) -> usize {
        if !self.kind.trains() {
            return 0;
        }
        let (mut live, mut peak) = (0usize, 0usize);
        for i in self.instrs(stage) {
            match i {
                Instr::Fwd { .. } => {
                    live += 1;
                    peak = peak.max(live);
                }
                Instr::Bwd { .. } => live = live.saturating_sub(1),
                _ => {}
            }
        }
        peak
    }

    /// The spec's bound on [`Schedule::peak_in_flight`] (§5.5): `m` for
    /// GPipe, `min(p − r, m)` for 1F1B (DeepSpeed's and Megatron's),
    /// `min(2(p − r − 1) + (v − 1)·g + 1, m·v)` chunk-micro-batches for
    /// interleaved with group size `g` (Megatron's warm-up plus one), 0 for
    /// inference.
    pub fn in_flight_bound(&self, stage: usize) -> usize {
        let (p, m, v) = (self.stages, self.micro_batches, self.chunks);
        match self.kind {
            ScheduleKind::GPipe => m,
            ScheduleKind::DeepSpeed | ScheduleKind::OneFOneB => (p - stage).min(m),
            ScheduleKind::Interleaved => (2 * (p - stage - 1) + (v - 1) * self.group + 1).min(m * v),
            ScheduleKind::Inference => 0,
        }
    }

    fn check_stage(&self, s: usize) -> Result<()> {
        let (p, m, v) = (self.stages, self.micro_batches, self.chunks);
        let last_k = v * p - 1;
        let trains = self.kind.trains();
        let prog: Vec<Instr> = self.instrs(s).copied().collect();
        let mut at: HashMap<Instr, Vec<usize>> = HashMap::new();
        for (i, instr) in prog.iter().enumerate() {
            at.entry(*instr).or_default().push(i);
        }
        let once = |instr: Instr| -> Result<usize> {
            match at.get(&instr).map(Vec::as_slice) {
                Some(&[i]) => Ok(i),
                found => Err(bad(format!(
                    "stage {s} runs {instr} {} times, not once",
                    found.map_or(0, <[usize]>::len)
                ))),
            }
        };
        let never = |instr: Instr| -> Result<()> {
            match at.get(&instr) {
                Some(_) => Err(bad(format!("stage {s} runs {instr}, which has no peer"))),
                None => Ok(()),
            }
        };
        let before = |a: usize, b: usize, what: String| -> Result<()> {
            if a < b {
                Ok(())
            } else {
                Err(bad(format!("stage {s}: {what}")))
            }
        };
        let mut expected = 0usize;
        let mut last_bwd = None;
        for chunk in 0..v {
            let k = self.virtual_stage(s, chunk);
            for mb in 0..m {
                let f = once(Instr::Fwd { mb, chunk })?;
                expected += 1;
                let recv = Instr::RecvAct { mb, chunk };
                let send = Instr::SendAct { mb, chunk };
                if k > 0 {
                    before(once(recv)?, f, format!("{recv} after its forward"))?;
                    expected += 1;
                } else {
                    never(recv)?;
                }
                if k < last_k {
                    before(f, once(send)?, format!("{send} before its forward"))?;
                    expected += 1;
                } else {
                    never(send)?;
                }
                if k == 0 || k == last_k {
                    let loads = at.get(&Instr::Load { mb }).map_or(&[][..], Vec::as_slice);
                    if !loads.iter().any(|&l| l < f) {
                        return Err(bad(format!("stage {s}: no Load{mb} before F{mb}c{chunk}")));
                    }
                }
                if !trains {
                    never(Instr::Bwd { mb, chunk })?;
                    continue;
                }
                let b = once(Instr::Bwd { mb, chunk })?;
                expected += 1;
                before(
                    f,
                    b,
                    format!("the backward of micro-batch {mb} chunk {chunk} before its forward"),
                )?;
                last_bwd = last_bwd.max(Some(b));
                let recv = Instr::RecvGrad { mb, chunk };
                let send = Instr::SendGrad { mb, chunk };
                if k < last_k {
                    before(once(recv)?, b, format!("{recv} after its backward"))?;
                    expected += 1;
                } else {
                    never(recv)?;
                }
                if k > 0 {
                    before(b, once(send)?, format!("{send} before its backward"))?;
                    expected += 1;
                } else {
                    never(send)?;
                }
            }
        }
        // Loads: one per micro-batch for each end of the model this stage holds.
        let ends = usize::from(s == 0) + usize::from(s == p - 1 && last_k != 0);
        for mb in 0..m {
            let n = at.get(&Instr::Load { mb }).map_or(0, Vec::len);
            if n != ends {
                return Err(bad(format!("stage {s} runs Load{mb} {n} times, not {ends}")));
            }
        }
        expected += ends * m;
        let end = [Instr::ReduceTiedGrads, Instr::ReduceGrads, Instr::OptimizerStep];
        if trains {
            let mut prev = last_bwd;
            for instr in end {
                let i = once(instr)?;
                if prev.is_some_and(|p| p >= i) {
                    return Err(bad(format!("stage {s}: {instr} out of order")));
                }
                prev = Some(i);
            }
            expected += end.len();
        } else {
            end.into_iter().try_for_each(never)?;
        }
        if prog.len() != expected {
            return Err(bad(format!(
                "stage {s} has {} instructions, {expected} expected: some refer to micro-batches or chunks outside {m} x {v}",
                prog.len()
            )));
        }
        Ok(())
    }

    /// Check 3: per ordered pair of stages and per channel (activations,
    /// gradients), the messages sent equal the messages received, in order.
    /// The two channels are separate streams, as Megatron's `next`/`prev`
    /// exchanges are: with interleaving and two stages, one peer is both the
    /// next and the previous stage, and its activations and gradients may
    /// interleave differently on the two sides (every message has its own
    /// tag, see [`Msg::tag`]).
    fn check_matching(&self) -> Result<()> {
        type Channel = (usize, usize, bool);
        let mut sent: HashMap<Channel, Vec<Msg>> = HashMap::new();
        let mut got: HashMap<Channel, Vec<Msg>> = HashMap::new();
        for s in 0..self.stages {
            for i in self.instrs(s).filter(|i| i.is_p2p()) {
                let r = self
                    .route(s, i)
                    .ok_or_else(|| bad(format!("{i} on stage {s} leaves the pipeline")))?;
                let (map, key) = if r.send {
                    (&mut sent, (s, r.peer, r.msg.grad))
                } else {
                    (&mut got, (r.peer, s, r.msg.grad))
                };
                map.entry(key).or_default().push(r.msg);
            }
        }
        let mut pairs: Vec<_> = sent.keys().chain(got.keys()).copied().collect();
        pairs.sort_unstable();
        pairs.dedup();
        for (a, b, grad) in pairs {
            let (x, y) = (sent.get(&(a, b, grad)), got.get(&(a, b, grad)));
            if x != y {
                let what = if grad { "gradients" } else { "activations" };
                return Err(bad(format!(
                    "stage {a} sends the {what} {:?} to stage {b}, which receives {:?}",
                    x.map_or(&[][..], Vec::as_slice),
                    y.map_or(&[][..], Vec::as_slice)
                )));
            }
        }
        Ok(())
    }

    /// Lockstep schedules: in every step, what stage `a` posts toward
    /// stage `b` is what `b` posts toward `a`, complemented, in order.
    fn check_lockstep(&self) -> Result<()> {
        let steps = self.programs[0].len();
        if self.programs.iter().any(|p| p.len() != steps) {
            return Err(bad(
                "a lockstep schedule needs the same number of steps on every stage".into(),
            ));
        }
        for t in 0..steps {
            for a in 0..self.stages {
                for b in a + 1..self.stages {
                    let toward = |x: usize, y: usize| -> Vec<(bool, Msg)> {
                        self.programs[x][t]
                            .iter()
                            .filter_map(|i| self.route(x, i))
                            .filter(|r| r.peer == y)
                            .map(|r| (r.send, r.msg))
                            .collect()
                    };
                    let ab: Vec<(bool, Msg)> = toward(a, b).into_iter().map(|(s, m)| (!s, m)).collect();
                    let ba = toward(b, a);
                    if ab != ba {
                        return Err(bad(format!(
                            "step {t}: stage {a} posts {ab:?} (complemented) toward stage {b}, which posts {ba:?}"
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

fn bad(msg: String) -> CommError {
    CommError::arg("Schedule::check", msg)
}
