//! `tessera-run`: a torchrun-like launcher.
//!
//! ```text
//! tessera-run --nproc-per-node N [--nnodes K --node-rank R --master-addr A --master-port P] -- PROGRAM ARGS...
//! ```
//!
//! Starts N copies of PROGRAM with torchrun's environment (`RANK`,
//! `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`,
//! `ROLE_RANK`, `ROLE_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), prefixes
//! every line they print with `[rankR]: `, and supervises them as torchrun
//! does: when one exits unsuccessfully, the others get SIGTERM, then SIGKILL
//! after the grace period, and the launcher exits with that rank's code (1
//! when it died from a signal). SIGTERM, SIGINT, SIGHUP and SIGQUIT sent to
//! the launcher are forwarded to every rank, with the same grace period
//! (a second signal kills at once); then the launcher dies by that signal.
//! Each rank runs in its own process group, and signals reach the whole
//! group, so what a rank started is stopped too. On one node without
//! `--master-port` it picks a free port. Under `srun` no launcher is
//! needed: the ranks read SLURM's variables.

#[cfg(unix)]
mod procs;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: tessera-run --nproc-per-node N [--nnodes K] [--node-rank R] \
[--master-addr ADDR] [--master-port PORT] [--grace-period SECONDS] [--] PROGRAM [ARGS...]

  --nproc-per-node N      ranks to start on this node (default 1)
  --nnodes K              nodes in the job (default 1)
  --node-rank R           this node's index, 0..K (default 0)
  --master-addr ADDR      host of rank 0's store (default 127.0.0.1)
  --master-port PORT      port of rank 0's store (default: a free port on one node, 29500 on several)
  --grace-period SECONDS  how long ranks may take to exit after SIGTERM before SIGKILL (default 30)";

/// torchrun's: `PContext.close` waits 30 s between the signal and SIGKILL.
const DEFAULT_GRACE: Duration = Duration::from_secs(30);

struct Args {
    nproc: usize,
    nnodes: usize,
    node_rank: usize,
    master_addr: String,
    master_port: Option<u16>,
    grace: Duration,
    program: Vec<String>,
}

/// What the command line asks for.
enum Parsed {
    Run(Args),
    Help,
}

fn parse(argv: &[String]) -> Result<Parsed, String> {
    let mut a = Args {
        nproc: 1,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: None,
        grace: DEFAULT_GRACE,
        program: Vec::new(),
    };
    let mut i = 0;
    while i < argv.len() {
        let arg = argv[i].as_str();
        if arg == "--" {
            a.program = argv[i + 1..].to_vec();
            break;
        }
        if arg == "-h" || arg == "--help" {
            return Ok(Parsed::Help);
        }
        if !arg.starts_with('-') {
            // No `--`: the program starts here.
            a.program = argv[i..].to_vec();
            break;
        }
        // Accept `--flag value`, `--flag=value`, and torchrun's underscores.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.replace('_', "-"), Some(v.to_string())),
            None => (arg.replace('_', "-"), None),
        };
        let value = match inline {
            Some(v) => v,
            None => {
                i += 1;
                argv.get(i)
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))?
            }
        };
        let num = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag}: {v:?} is not a number"))
        };
        match flag.as_str() {
            "--nproc-per-node" => a.nproc = num(&value)?,
            "--nnodes" => a.nnodes = num(&value)?,
            "--node-rank" => a.node_rank = num(&value)?,
            "--master-addr" => a.master_addr = value,
            "--master-port" => {
                a.master_port = Some(
                    value
                        .parse()
                        .map_err(|_| format!("--master-port: {value:?} is not a port"))?,
                )
            }
            "--grace-period" => {
                a.grace = value
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| format!("--grace-period: {value:?} is not a number of seconds"))?
            }
            _ => return Err(format!("unknown option {flag}")),
        }
        i += 1;
    }
    if a.program.is_empty() {
        return Err("no program given".into());
    }
    if a.nproc == 0 || a.nnodes == 0 || a.node_rank >= a.nnodes {
        return Err(format!(
            "need --nproc-per-node >= 1 and --node-rank < --nnodes (got {}, {}, {})",
            a.nproc, a.node_rank, a.nnodes
        ));
    }
    Ok(Parsed::Run(a))
}

/// A free port on this host (the kernel picks it; it is released at once).
fn free_port(addr: &str) -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind((addr, 0))?.local_addr()?.port())
}

/// Copies `from` to our stdout or stderr line by line, prefixed.
fn pump(from: impl Read + Send + 'static, prefix: String, to_err: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if !line.ends_with(b"\n") {
                        line.push(b'\n');
                    }
                    let mut out: Box<dyn Write> = if to_err {
                        Box::new(std::io::stderr().lock())
                    } else {
                        Box::new(std::io::stdout().lock())
                    };
                    let _ = out
                        .write_all(prefix.as_bytes())
                        .and_then(|_| out.write_all(&line));
                }
            }
        }
    })
}

#[cfg(not(unix))]
fn main() -> ExitCode {
    eprintln!("tessera-run: needs Unix signals and process groups; start the ranks yourself");
    ExitCode::from(1)
}

#[cfg(unix)]
fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse(&argv) {
        Ok(Parsed::Run(a)) => a,
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("tessera-run: {msg}");
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = procs::catch_signals() {
        eprintln!("tessera-run: cannot install signal handlers: {e}");
        return ExitCode::from(1);
    }
    let port = match a.master_port {
        Some(p) => p,
        None if a.nnodes == 1 => match free_port(&a.master_addr) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("tessera-run: cannot find a free port on {}: {e}", a.master_addr);
                return ExitCode::from(1);
            }
        },
        None => tessera_parallel::env::DEFAULT_MASTER_PORT,
    };
    let world = a.nproc * a.nnodes;
    let mut children: Vec<(usize, Child)> = Vec::new();
    let mut pumps = Vec::new();
    for local in 0..a.nproc {
        let rank = a.node_rank * a.nproc + local;
        let mut cmd = Command::new(&a.program[0]);
        cmd.args(&a.program[1..])
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_WORLD_SIZE", a.nproc.to_string())
            .env("GROUP_RANK", a.node_rank.to_string())
            .env("ROLE_RANK", rank.to_string())
            .env("ROLE_WORLD_SIZE", world.to_string())
            .env("MASTER_ADDR", &a.master_addr)
            .env("MASTER_PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match procs::own_group(&mut cmd).spawn() {
            Ok(mut c) => {
                if let Some(o) = c.stdout.take() {
                    pumps.push(pump(o, format!("[rank{rank}]: "), false));
                }
                if let Some(e) = c.stderr.take() {
                    pumps.push(pump(e, format!("[rank{rank}]: "), true));
                }
                children.push((rank, c));
            }
            Err(e) => {
                eprintln!("tessera-run: cannot start {:?}: {e}", a.program[0]);
                stop_all(&mut children, procs::TERM, a.grace);
                return ExitCode::from(1);
            }
        }
    }
    match supervise(&mut children, a.grace) {
        Outcome::Done => {
            for p in pumps {
                let _ = p.join();
            }
            ExitCode::SUCCESS
        }
        // The ranks' output may be held open by processes that left their
        // group; exiting closes our side anyway.
        Outcome::Failed(code) => ExitCode::from(code),
        Outcome::Signalled(sig) => {
            let _ = std::io::stdout().flush();
            procs::die_by(sig)
        }
    }
}

/// How the ranks ended.
#[cfg(unix)]
enum Outcome {
    /// Every rank exited successfully.
    Done,
    /// A rank failed; the launcher's exit code.
    Failed(u8),
    /// The launcher got this signal and stopped the ranks.
    Signalled(i32),
}

/// Waits for every child; on the first failure or signal stops the rest.
#[cfg(unix)]
fn supervise(children: &mut [(usize, Child)], grace: Duration) -> Outcome {
    let mut running: Vec<bool> = vec![true; children.len()];
    while running.iter().any(|&r| r) {
        if let Some(sig) = procs::take_signal() {
            eprintln!("tessera-run: got signal {sig}; forwarding it to the ranks (SIGKILL after {grace:?})");
            stop_all(children, sig, grace);
            return Outcome::Signalled(sig);
        }
        for i in 0..children.len() {
            if !running[i] {
                continue;
            }
            let (rank, child) = &mut children[i];
            match child.try_wait() {
                Ok(Some(status)) if status.success() => running[i] = false,
                Ok(Some(status)) => {
                    let rank = *rank;
                    eprintln!("tessera-run: rank {rank} failed ({status}); stopping the other ranks");
                    stop_all(children, procs::TERM, grace);
                    return Outcome::Failed(status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1).max(1)));
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("tessera-run: cannot wait for rank {rank}: {e}");
                    stop_all(children, procs::TERM, grace);
                    return Outcome::Failed(1);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Outcome::Done
}

/// Sends `sig` to every rank's process group, waits up to `grace` for the
/// groups to empty (a further signal to the launcher cuts it short), then
/// SIGKILLs what is left and reaps every rank.
#[cfg(unix)]
fn stop_all(children: &mut [(usize, Child)], sig: i32, grace: Duration) {
    for (_, c) in children.iter() {
        procs::signal_group(c, sig);
    }
    let deadline = Instant::now() + grace;
    loop {
        let mut alive = false;
        for (_, c) in children.iter_mut() {
            // Reap the leader first: a zombie still counts as a member.
            let _ = c.try_wait();
            alive |= procs::group_alive(c);
        }
        if !alive || Instant::now() >= deadline || procs::take_signal().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for (_, c) in children.iter_mut() {
        if procs::group_alive(c) {
            procs::signal_group(c, procs::KILL);
        }
        let _ = c.wait();
    }
}
