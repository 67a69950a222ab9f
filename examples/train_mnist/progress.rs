//! A one-line progress bar on stderr: position, running loss and accuracy,
//! samples/s and ETA, redrawn at most ten times a second.

use std::io::Write;
use std::time::{Duration, Instant};

/// The progress of one epoch.
pub struct Bar {
    label: String,
    total: usize,
    start: Instant,
    last_draw: Option<Instant>,
}

impl Bar {
    /// A bar for `total` steps.
    pub fn new(label: String, total: usize) -> Bar {
        Bar {
            label,
            total,
            start: Instant::now(),
            last_draw: None,
        }
    }

    /// Redraws after `done` steps covering `samples` samples.
    pub fn update(&mut self, done: usize, samples: usize, loss: f64, acc: f64) {
        let now = Instant::now();
        let due = self
            .last_draw
            .is_none_or(|t| now - t >= Duration::from_millis(100));
        if !due && done < self.total {
            return;
        }
        self.last_draw = Some(now);
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let rate = samples as f64 / secs;
        let eta = if done > 0 {
            secs * (self.total - done) as f64 / done as f64
        } else {
            0.0
        };
        const W: usize = 24;
        let filled = (W * done).checked_div(self.total).unwrap_or(W);
        let bar: String = (0..W).map(|i| if i < filled { '#' } else { '-' }).collect();
        eprint!(
            "\r{} [{bar}] {done}/{} loss {loss:.4} acc {:.2}% {rate:.0} samples/s ETA {eta:.0}s   ",
            self.label,
            self.total,
            100.0 * acc
        );
        let _ = std::io::stderr().flush();
    }

    /// Ends the line.
    pub fn finish(&self) {
        eprintln!();
    }
}
