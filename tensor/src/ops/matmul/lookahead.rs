//! Prefetching the operand blocks of a GEMM's next depth block while the
//! kernels run on this one.
//!
//! Packing a block streams it from memory at the memory's pace, and the
//! kernels then run at the core's: the two never overlap unless the next
//! block's lines are asked for during the kernels. A weight gradient
//! (`gᵀ·x` over 8320 tokens) packs 2 × 6 MiB that no cache holds; issued a
//! few lines per tile, the requests ride along with compute-bound kernels.

use std::ops::Range;

use super::pack::{prefetch_line, MatRef, L2};

/// Bytes of next-block operands a task prefetches at most: into L2, next
/// to the packed panels it is reading.
const BUDGET: usize = 256 << 10;

/// The next depth block's runs of one task, and how far they have been
/// requested.
pub(super) struct Lookahead<'a, S> {
    parts: [Option<Runs<'a, S>>; 2],
    /// Lines to request per tile.
    per_tile: usize,
    part: usize,
    run: usize,
    line: usize,
}

impl<'a, S> Lookahead<'a, S> {
    /// The plan for the block `rows × depth` of `a` and `depth × cols` of
    /// `b`, spread over `tiles` tiles; requests nothing when the operands
    /// are not stored in runs along one of their dimensions or the block
    /// exceeds the budget.
    pub(super) fn new(
        a: &MatRef<'a, S>,
        b: &MatRef<'a, S>,
        rows: Range<usize>,
        depth: Range<usize>,
        cols: Range<usize>,
        tiles: usize,
    ) -> Self {
        let parts = [Runs::of(a, rows, depth.clone()), Runs::of(b, depth, cols)];
        let lines: usize = parts.iter().flatten().map(Runs::lines).sum();
        // Over the budget, no tile requests anything (`per_tile` 0).
        let lines = if lines * 64 > BUDGET { 0 } else { lines };
        Lookahead {
            parts,
            per_tile: lines.div_ceil(tiles.max(1)),
            part: 0,
            run: 0,
            line: 0,
        }
    }

    /// Requests the next tile's share of the lines.
    #[inline]
    pub(super) fn step(&mut self) {
        let mut left = self.per_tile;
        while left > 0 && self.part < self.parts.len() {
            let Some(runs) = &self.parts[self.part] else {
                self.part += 1;
                continue;
            };
            if self.run == runs.count {
                (self.part, self.run, self.line) = (self.part + 1, 0, 0);
                continue;
            }
            runs.fetch(self.run, self.line);
            left -= 1;
            self.line += 1;
            if self.line == runs.lines_per_run() {
                (self.run, self.line) = (self.run + 1, 0);
            }
        }
    }
}

/// A block stored as `count` runs of `len` contiguous elements, run `i`
/// starting at `first + i·step`.
struct Runs<'a, S> {
    data: &'a [S],
    first: isize,
    step: isize,
    count: usize,
    len: usize,
}

impl<'a, S> Runs<'a, S> {
    /// The block `rows × cols` of `m` as runs along its unit-stride
    /// dimension, if it has one.
    fn of(m: &MatRef<'a, S>, rows: Range<usize>, cols: Range<usize>) -> Option<Self> {
        if rows.is_empty() || cols.is_empty() {
            return None;
        }
        let first = m.at(rows.start, cols.start) as isize;
        let (step, count, len) = if m.cs == 1 {
            (m.rs, rows.len(), cols.len())
        } else if m.rs == 1 {
            (m.cs, cols.len(), rows.len())
        } else {
            return None;
        };
        Some(Runs {
            data: m.data,
            first,
            step,
            count,
            len,
        })
    }

    fn lines_per_run(&self) -> usize {
        (self.len * size_of::<S>()).div_ceil(64)
    }

    fn lines(&self) -> usize {
        self.count * self.lines_per_run()
    }

    /// Requests line `line` of run `run` into L2.
    #[inline(always)]
    fn fetch(&self, run: usize, line: usize) {
        let at = (self.first + run as isize * self.step) as usize;
        let p = self.data.as_ptr().wrapping_add(at).cast::<i8>();
        prefetch_line::<L2>(p.wrapping_add(line * 64));
    }
}
