//! The operating-system side of supervising ranks: each rank runs in its
//! own process group, so a signal reaches the rank and everything it
//! started (a shell's children, data-loader processes) and nothing is
//! orphaned; the launcher catches the termination signals torchrun handles
//! and the supervisor forwards them.

use std::process::{Child, Command};

/// The signals the launcher forwards to its ranks (torchrun's default set).
const HANDLED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

static PENDING: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn record(sig: libc::c_int) {
    // Only an atomic store: all a signal handler may safely do.
    PENDING.store(sig, std::sync::atomic::Ordering::SeqCst);
}

/// Catches SIGTERM, SIGINT, SIGHUP and SIGQUIT; [`take_signal`] reports
/// them. Call before starting ranks (they get the default dispositions
/// back at `exec`). Errors when the handlers cannot be installed.
pub fn catch_signals() -> std::io::Result<()> {
    for sig in HANDLED {
        // SAFETY: `sa` is zero-initialised then filled with a handler that
        // only stores to an atomic; `sigaction` reads it and nothing else.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = record as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signal received since the last call, if any.
pub fn take_signal() -> Option<i32> {
    match PENDING.swap(0, std::sync::atomic::Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// Makes the rank the leader of a new process group.
pub fn own_group(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0)
}

/// Sends `sig` to the rank's process group. A group that is already gone
/// is not an error.
pub fn signal_group(child: &Child, sig: i32) {
    if let Ok(pgid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(-pgid, sig) };
    }
}

/// Whether any process of the rank's group is still alive (the rank
/// itself until it is reaped, then whatever it started). The group id is
/// the rank's pid, which the kernel does not reuse while the group exists.
pub fn group_alive(child: &Child) -> bool {
    let Ok(pgid) = libc::pid_t::try_from(child.id()) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the group exists.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// Ends the launcher by `sig` with its default disposition, so whoever
/// started it sees "killed by SIGTERM", as they would without a launcher.
pub fn die_by(sig: i32) -> ! {
    // SAFETY: restoring the default disposition and raising a signal have
    // no memory-safety preconditions.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
    // SIGQUIT's default may be blocked by the caller's mask; exit as a shell would.
    std::process::exit(128 + sig)
}

/// The termination signal: SIGTERM.
pub const TERM: i32 = libc::SIGTERM;
/// The kill signal: SIGKILL.
pub const KILL: i32 = libc::SIGKILL;
