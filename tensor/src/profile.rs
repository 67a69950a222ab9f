//! A per-op profiler: [`profile`] runs a closure and returns, beside its
//! result, a [`Profile`] of every op it ran — name, input shapes, wall time,
//! bytes of tensor storage allocated, and whether it ran in a backward pass —
//! as a table sorted by time ([`Profile::table`]) or a Chrome trace
//! ([`Profile::chrome_trace`], for `chrome://tracing` or Perfetto).
//!
//! Ops are recorded where they pass anyway: the backend dispatch (every op
//! that reaches a kernel through [`crate::backend`]) opens a [`Span`], and so
//! does each node the autograd engine runs, so a backward node's span holds
//! the spans of the ops its rule calls. The table reports each op's *self*
//! time (its span less the spans nested in it), so the rows add up to the
//! profiled time without counting anything twice. Bytes are counted at the
//! one place CPU storage is allocated and charged to the innermost open span.
//!
//! A profile records the ops the calling thread runs (the kernels' worker
//! threads work inside those ops, so their time is in them); ops that other
//! threads run meanwhile are not part of it, which keeps concurrent
//! profiles, and tests, apart. While no profile runs on a thread, recording
//! costs one thread-local flag read per op.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

use crate::{Error, Result};

/// Runs `f` and returns its result with the profile of the ops it ran on
/// this thread. Profiles do not nest: a `profile` inside another one
/// records nothing of its own and returns an empty [`Profile`] (the outer
/// one keeps recording).
pub fn profile<R>(f: impl FnOnce() -> R) -> (R, Profile) {
    if RECORDER.with(|r| r.borrow().is_some()) {
        return (f(), Profile::default());
    }
    let start = Instant::now();
    RECORDER.with(|r| {
        *r.borrow_mut() = Some(Recorder {
            start,
            events: Vec::new(),
            stack: Vec::new(),
        })
    });
    // Taken back on unwinding too, so a panic in `f` leaves no recorder.
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            RECORDER.with(|r| r.borrow_mut().take());
        }
    }
    let stop = Stop;
    let out = f();
    let events = RECORDER.with(|r| r.borrow_mut().as_mut().map(|r| std::mem::take(&mut r.events)));
    drop(stop);
    let wall_ns = start.elapsed().as_nanos() as u64;
    (
        out,
        Profile {
            events: events.unwrap_or_default(),
            wall_ns,
        },
    )
}

/// Where an op ran: in a backward pass (inside the autograd engine) or
/// anywhere else (the forward pass, an optimizer step, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Outside a backward pass.
    Forward,
    /// Inside a backward pass.
    Backward,
}

impl Phase {
    /// "forward" or "backward".
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
        }
    }
}

/// One recorded op call.
#[derive(Debug, Clone)]
pub struct OpEvent {
    /// The op's name (a backward node: its forward op's name).
    pub name: &'static str,
    /// The shapes of its tensor operands, in order.
    pub shapes: Vec<Vec<usize>>,
    /// Forward or backward.
    pub phase: Phase,
    /// Start, in ns since the profile began.
    pub start_ns: u64,
    /// Wall time of the whole span, ns.
    pub dur_ns: u64,
    /// Wall time less the spans nested in it, ns.
    pub self_ns: u64,
    /// Bytes of tensor storage allocated while it was the innermost span.
    pub bytes: u64,
    /// Nesting depth (0: not inside another span).
    pub depth: usize,
}

/// The ops recorded by [`profile`], in the order they finished.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    /// Every op call.
    pub events: Vec<OpEvent>,
    /// The wall time of the profiled closure, ns.
    pub wall_ns: u64,
}

/// One row of [`Profile::summary`]: the calls of one op with the same phase
/// and operand shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct OpSummary {
    /// The op's name.
    pub name: &'static str,
    /// Forward or backward.
    pub phase: Phase,
    /// The operand shapes of these calls.
    pub shapes: Vec<Vec<usize>>,
    /// How many calls.
    pub calls: usize,
    /// Σ self time, ns.
    pub self_ns: u64,
    /// Σ span time, ns.
    pub total_ns: u64,
    /// Σ bytes allocated.
    pub bytes: u64,
}

impl Profile {
    /// The calls grouped by (op, phase, shapes), largest self time first.
    pub fn summary(&self) -> Vec<OpSummary> {
        let mut rows: HashMap<(&'static str, Phase, &[Vec<usize>]), OpSummary> = HashMap::new();
        for e in &self.events {
            let row = rows
                .entry((e.name, e.phase, &e.shapes))
                .or_insert_with(|| OpSummary {
                    name: e.name,
                    phase: e.phase,
                    shapes: e.shapes.clone(),
                    calls: 0,
                    self_ns: 0,
                    total_ns: 0,
                    bytes: 0,
                });
            row.calls += 1;
            row.self_ns += e.self_ns;
            row.total_ns += e.dur_ns;
            row.bytes += e.bytes;
        }
        let mut rows: Vec<OpSummary> = rows.into_values().collect();
        rows.sort_by(|a, b| {
            (b.self_ns, a.name, a.phase, &a.shapes).cmp(&(a.self_ns, b.name, b.phase, &b.shapes))
        });
        rows
    }

    /// A text table of [`Profile::summary`]: self time (ms and share of the
    /// profiled wall time), calls, total time, bytes allocated, phase, op
    /// and shapes; at most `max_rows` rows, then a line for the rest.
    pub fn table(&self, max_rows: usize) -> String {
        let rows = self.summary();
        let wall = self.wall_ns.max(1) as f64;
        let mut s = format!(
            "{:>10} {:>6} {:>6} {:>10} {:>10}  {:<8} {:<28} shapes\n",
            "self ms", "%", "calls", "total ms", "alloc MiB", "phase", "op"
        );
        for r in rows.iter().take(max_rows) {
            let shapes = r
                .shapes
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(" ");
            let _ = writeln!(
                s,
                "{:>10.3} {:>6.1} {:>6} {:>10.3} {:>10.2}  {:<8} {:<28} {shapes}",
                r.self_ns as f64 * 1e-6,
                100.0 * r.self_ns as f64 / wall,
                r.calls,
                r.total_ns as f64 * 1e-6,
                r.bytes as f64 / (1 << 20) as f64,
                r.phase.name(),
                r.name,
            );
        }
        if rows.len() > max_rows {
            let rest: u64 = rows[max_rows..].iter().map(|r| r.self_ns).sum();
            let _ = writeln!(
                s,
                "{:>10.3} {:>6.1}  ({} more rows)",
                rest as f64 * 1e-6,
                100.0 * rest as f64 / wall,
                rows.len() - max_rows
            );
        }
        let recorded: u64 = self.events.iter().map(|e| e.self_ns).sum();
        let _ = writeln!(
            s,
            "{:>10.3} {:>6.1}  in recorded ops, of {:.3} ms wall",
            recorded as f64 * 1e-6,
            100.0 * recorded as f64 / wall,
            wall * 1e-6
        );
        s
    }

    /// The events as Chrome trace-event JSON (complete events, `"ph": "X"`,
    /// times in µs), with the shapes, bytes and self time as `args`.
    pub fn chrome_trace(&self) -> String {
        let mut s = String::from("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
        for (i, e) in self.events.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let shapes = e
                .shapes
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(" ");
            let _ = write!(
                s,
                "{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":1,\"tid\":1,\
                 \"args\":{{\"shapes\":\"{}\",\"bytes\":{},\"self_us\":{:.3}}}}}",
                json_escape(e.name),
                e.phase.name(),
                e.start_ns as f64 * 1e-3,
                e.dur_ns as f64 * 1e-3,
                shapes,
                e.bytes,
                e.self_ns as f64 * 1e-3
            );
        }
        s.push_str("]}");
        s
    }

    /// Writes [`Profile::chrome_trace`] to `path`. Errors (naming the path)
    /// when the file cannot be written.
    pub fn write_chrome_trace(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.chrome_trace()).map_err(|e| {
            Error::io(
                "Profile::write_chrome_trace",
                format!("cannot write {}: {e}", path.display()),
            )
        })
    }
}

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// An open op span: records an [`OpEvent`] when dropped. Inert (and free)
/// while no profile runs.
#[must_use = "a span measures until it is dropped"]
pub struct Span(Option<Open>);

struct Open {
    name: &'static str,
    shapes: Vec<Vec<usize>>,
    start: Instant,
}

/// Opens a span for op `name` with operand shapes from `shapes` (called
/// only while profiling, so collecting them costs nothing otherwise).
pub(crate) fn span(name: &'static str, shapes: impl FnOnce() -> Vec<Vec<usize>>) -> Span {
    let open = RECORDER.with(|r| match r.borrow_mut().as_mut() {
        Some(rec) => {
            rec.stack.push(Frame::default());
            true
        }
        None => false,
    });
    Span(open.then(|| Open {
        name,
        shapes: shapes(),
        start: Instant::now(),
    }))
}

/// Opens a span for op `name` over `tensors`, for ops outside the backend
/// dispatch (the autograd engine's nodes). Inert while no profile runs.
pub fn op_span<'a>(name: &'static str, tensors: impl IntoIterator<Item = &'a crate::Tensor>) -> Span {
    span(name, || tensors.into_iter().map(|t| t.shape().to_vec()).collect())
}

/// Marks the current thread as running a backward pass until the guard
/// drops (the autograd engine's scope); spans opened meanwhile are
/// [`Phase::Backward`].
pub fn backward_scope() -> PhaseGuard {
    PhaseGuard(IN_BACKWARD.with(|b| b.replace(true)))
}

/// Restores the phase of [`backward_scope`] on drop.
pub struct PhaseGuard(bool);

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        IN_BACKWARD.with(|b| b.set(self.0));
    }
}

/// Charges `bytes` just allocated to the innermost open span of this thread
/// (allocations on the kernels' worker threads are not charged).
pub(crate) fn note_alloc(bytes: usize) {
    RECORDER.with(|r| {
        if let Some(f) = r.borrow_mut().as_mut().and_then(|r| r.stack.last_mut()) {
            f.bytes += bytes as u64;
        }
    });
}

impl Drop for Span {
    fn drop(&mut self) {
        let Some(open) = self.0.take() else { return };
        let end = Instant::now();
        let dur_ns = end.duration_since(open.start).as_nanos() as u64;
        let phase = if IN_BACKWARD.with(|b| b.get()) {
            Phase::Backward
        } else {
            Phase::Forward
        };
        RECORDER.with(|r| {
            // The profile that opened the span may have ended (a span kept
            // past the closure): then there is nothing to record into.
            let mut r = r.borrow_mut();
            let Some(rec) = r.as_mut() else { return };
            let frame = rec.stack.pop().unwrap_or_default();
            if let Some(parent) = rec.stack.last_mut() {
                parent.child_ns += dur_ns;
            }
            let event = OpEvent {
                name: open.name,
                shapes: open.shapes,
                phase,
                start_ns: open.start.saturating_duration_since(rec.start).as_nanos() as u64,
                dur_ns,
                self_ns: dur_ns.saturating_sub(frame.child_ns),
                bytes: frame.bytes,
                depth: rec.stack.len(),
            };
            rec.events.push(event);
        });
    }
}

#[derive(Default)]
struct Frame {
    child_ns: u64,
    bytes: u64,
}

/// The state of the profile running on a thread.
struct Recorder {
    start: Instant,
    events: Vec<OpEvent>,
    /// One frame per open span, innermost last.
    stack: Vec<Frame>,
}

thread_local! {
    static RECORDER: RefCell<Option<Recorder>> = const { RefCell::new(None) };
    static IN_BACKWARD: Cell<bool> = const { Cell::new(false) };
}

#[cfg(test)]
#[path = "profile_tests.rs"]
mod tests;
