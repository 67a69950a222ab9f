//! `tessera-run`: a torchrun-like launcher.
//!
//! ```text
//! tessera-run --nproc-per-node N [--nnodes K --node-rank R --master-addr A --master-port P] -- PROGRAM ARGS...
//! ```
//!
//! Starts N copies of PROGRAM with torchrun's environment (`RANK`,
//! `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`,
//! `ROLE_RANK`, `ROLE_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), prefixes
//! every line they print with `[rankR]: `, and when one exits unsuccessfully
//! kills the others and exits with that rank's code (1 when it died from a
//! signal; the killed ranks get SIGKILL). On one node without `--master-port` it picks a free port.
//! Under `srun` no launcher is needed: the ranks read SLURM's variables.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

const USAGE: &str = "usage: tessera-run --nproc-per-node N [--nnodes K] [--node-rank R] \
[--master-addr ADDR] [--master-port PORT] -- PROGRAM [ARGS...]";

struct Args {
    nproc: usize,
    nnodes: usize,
    node_rank: usize,
    master_addr: String,
    master_port: Option<u16>,
    program: Vec<String>,
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        nproc: 1,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: None,
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
            return Err(String::new());
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
            _ if !flag.starts_with('-') => {
                // No `--`: the program starts here.
                a.program = argv[i - 1..].to_vec();
                break;
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
    Ok(a)
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

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse(&argv) {
        Ok(a) => a,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("tessera-run: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
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
        let spawned = Command::new(&a.program[0])
            .args(&a.program[1..])
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
            .stderr(Stdio::piped())
            .spawn();
        match spawned {
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
                stop_all(&mut children);
                return ExitCode::from(1);
            }
        }
    }
    let code = supervise(&mut children);
    if code == 0 {
        // On failure the output of killed ranks may be held open by their
        // own children; exiting closes our side anyway.
        for p in pumps {
            let _ = p.join();
        }
    }
    ExitCode::from(code)
}

/// Waits for every child; on the first failure kills the rest. Returns
/// the exit code for the launcher.
fn supervise(children: &mut [(usize, Child)]) -> u8 {
    let mut running: Vec<bool> = vec![true; children.len()];
    while running.iter().any(|&r| r) {
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
                    stop_all(children);
                    return status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1).max(1));
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("tessera-run: cannot wait for rank {rank}: {e}");
                    stop_all(children);
                    return 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    0
}

fn stop_all(children: &mut [(usize, Child)]) {
    for (_, c) in children.iter_mut() {
        // Already-exited children make kill fail harmlessly.
        let _ = c.kill();
    }
    for (_, c) in children.iter_mut() {
        let _ = c.wait();
    }
}
