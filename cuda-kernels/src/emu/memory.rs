//! The emulated device's memory: host allocations with guard bytes on both
//! sides, a table of live blocks that every copy is checked against, and a
//! capacity, so running out of device memory is an error as on a GPU.

use std::alloc::{alloc, dealloc, Layout};
use std::collections::BTreeMap;
use std::ptr::NonNull;

use crate::{Error, Result};

/// Bytes before each block: keeps the 256-byte alignment of `cudaMalloc`.
const FRONT: usize = 256;
/// Guard bytes after each block.
const REAR: usize = 64;
/// Guard bytes checked on each side after every launch.
const CHECKED: usize = 64;
const GUARD_BYTE: u8 = 0xA5;
/// Fresh memory reads as NaN in every float type (and -1 in integers), so a
/// kernel reading an element nobody wrote shows it.
const POISON_BYTE: u8 = 0xFF;

struct Block {
    base: NonNull<u8>,
    layout: Layout,
    bytes: usize,
}

// SAFETY: a block is plain host memory owned by the table; the device's
// lock serialises every access through it.
unsafe impl Send for Block {}

impl Block {
    fn addr(&self) -> u64 {
        self.base.as_ptr() as u64 + FRONT as u64
    }

    /// The checked guard bytes: just before the block and just after it.
    fn guards(&self) -> [&[u8]; 2] {
        // SAFETY: the layout spans FRONT + bytes + REAR bytes from `base`.
        unsafe {
            let p = self.base.as_ptr();
            [
                std::slice::from_raw_parts(p.add(FRONT - CHECKED), CHECKED),
                std::slice::from_raw_parts(p.add(FRONT + self.bytes), CHECKED.min(REAR)),
            ]
        }
    }
}

/// Live blocks by address, and the bytes they hold against the capacity.
pub(super) struct Memory {
    blocks: BTreeMap<u64, Block>,
    used: usize,
    capacity: usize,
}

impl Memory {
    pub(super) fn new(capacity: usize) -> Self {
        Memory {
            blocks: BTreeMap::new(),
            used: 0,
            capacity,
        }
    }

    /// A poisoned block of `bytes` (at least 1) between guard bytes.
    pub(super) fn alloc(&mut self, bytes: usize) -> Result<u64> {
        let bytes = bytes.max(1);
        let oom = |why: &str| Error::OutOfMemory {
            bytes,
            msg: format!(
                "{why} ({} of {} bytes of emulated device memory in use)",
                self.used, self.capacity
            ),
        };
        if bytes > self.capacity - self.used {
            return Err(oom("beyond the emulated device's capacity"));
        }
        let layout = FRONT
            .checked_add(bytes)
            .and_then(|n| n.checked_add(REAR))
            .and_then(|n| Layout::from_size_align(n, FRONT).ok())
            .ok_or_else(|| oom("too large for the address space"))?;
        // SAFETY: the layout has a non-zero size.
        let base =
            NonNull::new(unsafe { alloc(layout) }).ok_or_else(|| oom("the host refused the memory"))?;
        // SAFETY: the block spans `layout.size()` bytes.
        unsafe {
            let p = base.as_ptr();
            std::ptr::write_bytes(p, GUARD_BYTE, FRONT);
            std::ptr::write_bytes(p.add(FRONT), POISON_BYTE, bytes);
            std::ptr::write_bytes(p.add(FRONT + bytes), GUARD_BYTE, REAR);
        }
        let block = Block { base, layout, bytes };
        let addr = block.addr();
        self.blocks.insert(addr, block);
        self.used += bytes;
        Ok(addr)
    }

    pub(super) fn free(&mut self, addr: u64) -> Result<()> {
        let block = self.blocks.remove(&addr).ok_or_else(|| Error::Emulator {
            op: "free",
            msg: format!("{addr:#x} is not a live allocation (freed twice, or never allocated)"),
        })?;
        self.used -= block.bytes;
        // SAFETY: allocated in `alloc` with this layout; removed from the table.
        unsafe { dealloc(block.base.as_ptr(), block.layout) };
        Ok(())
    }

    /// Checks that `addr .. addr + len` lies inside one live block.
    pub(super) fn check(&self, op: &'static str, addr: u64, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let inside = self.blocks.range(..=addr).next_back().is_some_and(|(start, b)| {
            addr.checked_add(len as u64)
                .is_some_and(|end| end <= start + b.bytes as u64)
        });
        if inside {
            Ok(())
        } else {
            Err(Error::Emulator {
                op,
                msg: format!("{len} bytes at {addr:#x} are not inside one live allocation"),
            })
        }
    }

    /// The first block whose guard bytes were overwritten, as a message.
    pub(super) fn corrupted_guard(&self) -> Option<String> {
        self.blocks.values().find_map(|b| {
            let [before, after] = b.guards();
            let side = if before.iter().any(|&g| g != GUARD_BYTE) {
                "before its start"
            } else if after.iter().any(|&g| g != GUARD_BYTE) {
                "past its end"
            } else {
                return None;
            };
            Some(format!(
                "wrote outside buffer {:#x} ({} bytes), {side}",
                b.addr(),
                b.bytes
            ))
        })
    }

    /// Restores the guard bytes of every block (after a fault was reported,
    /// so the next launch is judged on its own).
    pub(super) fn repair_guards(&mut self) {
        for b in self.blocks.values() {
            // SAFETY: the block spans FRONT + bytes + REAR bytes from `base`.
            unsafe {
                let p = b.base.as_ptr();
                std::ptr::write_bytes(p, GUARD_BYTE, FRONT);
                std::ptr::write_bytes(p.add(FRONT + b.bytes), GUARD_BYTE, REAR);
            }
        }
    }

    /// Bytes held by live blocks.
    pub(super) fn used(&self) -> usize {
        self.used
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        for b in self.blocks.values() {
            // SAFETY: allocated in `alloc` with this layout; nothing uses it
            // once the device is gone.
            unsafe { dealloc(b.base.as_ptr(), b.layout) };
        }
    }
}
