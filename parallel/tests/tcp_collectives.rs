//! Own test binary: it re-executes itself as the ranks, and its fault timeouts must not race the CPU-heavy local suites.
//!
//! The collective suite over `tcp` with real processes on loopback, and the
//! fault tests: a rank that dies or stalls mid all-reduce, a rank that never
//! arrives, ranks that disagree. The test binary spawns itself as the ranks
//! (the `child_entry` test runs a scenario when `TESSERA_TEST_CHILD` is set).

#[path = "it/common/mod.rs"]
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{check_case, check_gloo_pattern, Case, DTYPES};
use tessera_parallel::{tcp, CommError, CommExt, Communicator, ReduceOp};
use tessera_tensor::Tensor;

const CHILD: &str = "TESSERA_TEST_CHILD";
/// The communicator timeout of the fault scenarios, seconds.
const FAULT_TIMEOUT: f64 = 2.0;
/// The communicator timeout of the scenarios that must fail without waiting
/// for it: long, so that "fast" is told from "timed out" on a loaded machine.
const FAIL_FAST_TIMEOUT: f64 = 30.0;

/// Runs the scenario named by `TESSERA_TEST_CHILD` as one rank; a no-op in
/// the ordinary test run.
#[test]
fn child_entry() {
    let Ok(scenario) = std::env::var(CHILD) else {
        return;
    };
    let code = match run_child(&scenario) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rank failed: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn connect(segment: usize) -> Result<tessera_parallel::CpuComm, String> {
    let mut cfg = tcp::TcpConfig::from_env().map_err(|e| e.to_string())?;
    cfg.comm.max_segment_bytes = segment;
    tcp::connect(&cfg).map_err(|e| e.to_string())
}

fn run_child(scenario: &str) -> Result<(), String> {
    match scenario {
        "suite" => suite(),
        "die" | "stall" => fault(scenario == "stall"),
        "rendezvous" => connect(1 << 20).map(drop),
        "mismatch" => mismatch(),
        "roots" => roots(),
        "sum" => sum(),
        other => Err(format!("unknown scenario {other}")),
    }
}

/// A handful of cases of every collective and dtype, both all-reduce paths
/// (small messages take the direct exchange, large ones the ring in 1 KiB
/// segments), plus point-to-point and split.
fn suite() -> Result<(), String> {
    let comm = connect(1024)?;
    let (n, r) = (comm.world_size(), comm.rank());
    for len in [0, 1, n + 1, 1000, 10000] {
        check_gloo_pattern(&comm, len)?;
    }
    for (i, &dtype) in DTYPES.iter().enumerate() {
        for (j, len) in [0usize, 3, 777, 9001].into_iter().enumerate() {
            let op = ReduceOp::ALL[(i + j) % ReduceOp::ALL.len()];
            check_case(
                &comm,
                &Case {
                    seed: (i * 10 + j) as u64,
                    len,
                    dtype,
                    op,
                    root: i + j,
                },
            )?;
        }
    }
    // Point-to-point around the ring: a tensor, a slice and raw bytes.
    let e = |err: CommError| err.to_string();
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    let t = Tensor::from_vec((0..6).map(|i| (i + 10 * r) as f32).collect::<Vec<_>>(), &[2, 3])
        .map_err(|e| e.to_string())?;
    comm.send_tensor(&t, next, 7).map_err(e)?;
    comm.send_slice(&[r as i64; 5], next, 8).map_err(e)?;
    comm.send_bytes(b"hello", next, 9).map_err(e)?;
    let got = comm.recv_tensor(prev, 7).map_err(e)?;
    let want: Vec<f32> = (0..6).map(|i| (i + 10 * prev) as f32).collect();
    if got.shape() != [2, 3] || got.to_vec::<f32>().map_err(|e| e.to_string())? != want {
        return Err(format!("recv_tensor on rank {r}: {got:?}"));
    }
    let mut s = [0i64; 5];
    comm.recv_slice(&mut s, prev, 8).map_err(e)?;
    if s != [prev as i64; 5] || comm.recv_bytes(prev, 9).map_err(e)? != b"hello" {
        return Err(format!("p2p payloads on rank {r}"));
    }
    // Sub-groups: even and odd ranks, in reverse order.
    let sub = comm
        .split(Some((r % 2) as u32), -(r as i64))
        .map_err(e)?
        .ok_or("no sub-group")?;
    let members: Vec<usize> = (0..n).filter(|k| k % 2 == r % 2).collect();
    let mut x = [r as f64];
    sub.all_reduce_slice(&mut x, ReduceOp::Sum).map_err(e)?;
    if x[0] != members.iter().sum::<usize>() as f64
        || sub.rank() != members.len() - 1 - members.iter().position(|&k| k == r).unwrap_or(0)
    {
        return Err(format!("split on rank {r}: sum {} rank {}", x[0], sub.rank()));
    }
    comm.barrier().map_err(e)
}

/// The last rank dies (or stalls) in the middle of a stream of large
/// all-reduces; every other rank must get an error within the timeout.
fn fault(stall: bool) -> Result<(), String> {
    let comm = connect(1 << 20)?;
    let (n, r) = (comm.world_size(), comm.rank());
    comm.barrier().map_err(|e| e.to_string())?;
    if r == n - 1 {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            if stall {
                std::thread::sleep(Duration::from_secs(120));
            }
            std::process::exit(3);
        });
        if stall {
            // Stop taking part without closing anything.
            std::thread::sleep(Duration::from_secs(120));
        }
    }
    let mut buf = vec![1.0f32; 4 << 20];
    for i in 0..200 {
        let t = Instant::now();
        match comm.all_reduce_slice(&mut buf, ReduceOp::Sum) {
            Ok(()) => continue,
            Err(e) => {
                let waited = t.elapsed().as_secs_f64();
                eprintln!("rank {r}: all_reduce #{i} failed after {waited:.2}s: {e}");
                let kind_ok = matches!(
                    e,
                    CommError::PeerClosed { .. } | CommError::Aborted { .. } | CommError::Timeout { .. }
                );
                if !kind_ok || waited > FAULT_TIMEOUT + 1.5 {
                    return Err(format!("wrong error or too late: {e:?}"));
                }
                // Later calls fail at once.
                let t = Instant::now();
                let again = comm.all_reduce_slice(&mut buf[..4], ReduceOp::Sum);
                if again.is_ok() || t.elapsed() > Duration::from_millis(100) {
                    return Err(format!("a failed group accepted another call: {again:?}"));
                }
                return Ok(());
            }
        }
    }
    Err(format!(
        "rank {r}: every all_reduce succeeded although a peer died"
    ))
}

/// Rank 0 all-reduces 10 elements, the others 12: an error, not a hang.
fn mismatch() -> Result<(), String> {
    let comm = connect(1 << 20)?;
    let len = if comm.rank() == 0 { 10 } else { 12 };
    let mut x = vec![1.0f64; len];
    match comm.all_reduce_slice(&mut x, ReduceOp::Sum) {
        Err(e @ (CommError::Mismatch { .. } | CommError::Aborted { .. })) => {
            eprintln!("rank {}: {e}", comm.rank());
            Ok(())
        }
        other => Err(format!("expected a mismatch error, got {other:?}")),
    }
}

/// Ranks 0 and 1 broadcast from root 0, rank 2 from root 1, then all
/// enter a barrier. Rank 2 waits for rank 1 (its parent in the tree of
/// root 1) and fails at once on whichever message comes first: rank 0's piece,
/// whose header names the other root, or rank 1's barrier message (rank 1
/// finished the broadcast without sending to rank 2) — the two arrive over
/// different connections in either order. The others then fail with rank
/// 2's abort notice, in the barrier or, when the notice overtakes rank 0's
/// piece, already in rank 1's broadcast (rank 0 may also see rank 1 hang up
/// first: the notice is then read behind the closed connection). Nobody
/// waits for the timeout.
fn roots() -> Result<(), String> {
    let comm = connect(1 << 20)?;
    let r = comm.rank();
    let t = Instant::now();
    let res = comm
        .broadcast_slice(&mut [1i64; 4], usize::from(r == 2))
        .and_then(|_| comm.barrier());
    if t.elapsed() > Duration::from_secs_f64(FAIL_FAST_TIMEOUT / 6.0) {
        return Err(format!("rank {r} waited {:?}", t.elapsed()));
    }
    const DIAGNOSES: [&str; 2] = [
        "root 0 on rank 0 vs root 1 on rank 2",
        "rank 1 is in barrier #1 while rank 2 is in broadcast #0",
    ];
    match res {
        Err(CommError::Mismatch {
            op: "broadcast", msg, ..
        }) if r == 2 && DIAGNOSES.contains(&msg.as_str()) => Ok(()),
        Err(CommError::Aborted {
            op: "barrier" | "broadcast",
            peer: 2,
            msg,
            ..
        }) if r != 2 && DIAGNOSES.iter().any(|d| msg.contains(d)) => Ok(()),
        other => Err(format!("rank {r}: unexpected {other:?}")),
    }
}

/// One all-reduce of the ranks' numbers, checked.
fn sum() -> Result<(), String> {
    let comm = connect(1 << 20)?;
    let (n, r) = (comm.world_size(), comm.rank());
    let mut x = [r as f64 + 1.0];
    comm.all_reduce_slice(&mut x, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let want = (n * (n + 1) / 2) as f64;
    if x[0] != want {
        return Err(format!("rank {r}: sum {} != {want}", x[0]));
    }
    Ok(())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts ranks `ranks` of a world of `n` running `scenario` with the
/// communicator timeout `timeout` (seconds).
fn spawn(n: usize, ranks: &[usize], scenario: &str, port: u16, timeout: f64) -> Vec<(usize, Child)> {
    let exe = std::env::current_exe().unwrap();
    ranks
        .iter()
        .map(|&k| {
            let child = Command::new(&exe)
                .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
                .env(CHILD, scenario)
                .env("RANK", k.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", k.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env(tcp::TIMEOUT_VAR, timeout.to_string())
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            (k, child)
        })
        .collect()
}

/// Waits for every child but rank `hung` (killing them all past `limit`,
/// and `hung` once the others are done); their exit codes.
fn wait_all(
    children: Vec<(usize, Child)>,
    limit: Duration,
    hung: Option<usize>,
) -> Vec<(usize, Option<i32>)> {
    let start = Instant::now();
    let mut children = children;
    let mut codes = vec![None; children.len()];
    let mut done: Vec<bool> = children.iter().map(|(k, _)| Some(*k) == hung).collect();
    while done.iter().any(|d| !d) && start.elapsed() < limit {
        for (i, (_, c)) in children.iter_mut().enumerate() {
            if !done[i] {
                if let Some(s) = c.try_wait().unwrap() {
                    codes[i] = s.code();
                    done[i] = true;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for (i, (_, c)) in children.iter_mut().enumerate() {
        if c.try_wait().unwrap().is_none() {
            let _ = c.kill();
            let _ = c.wait();
            codes[i] = None;
        }
    }
    children.iter().map(|(k, _)| *k).zip(codes).collect()
}

#[test]
fn suite_over_tcp_through_the_launcher() {
    let exe = std::env::current_exe().unwrap();
    for n in 2..=4 {
        let status = Command::new(env!("CARGO_BIN_EXE_tessera-run"))
            .args(["--nproc-per-node", &n.to_string(), "--"])
            .arg(&exe)
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD, "suite")
            .env(tcp::TIMEOUT_VAR, "20")
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "world size {n}: {status}");
    }
}

#[test]
fn a_rank_that_dies_mid_all_reduce_fails_the_others() {
    for (n, scenario) in [(2, "die"), (3, "die"), (3, "stall")] {
        let t = Instant::now();
        let ranks: Vec<usize> = (0..n).collect();
        let hung = (scenario == "stall").then_some(n - 1);
        let codes = wait_all(
            spawn(n, &ranks, scenario, free_port(), FAULT_TIMEOUT),
            Duration::from_secs(30),
            hung,
        );
        for (k, code) in codes {
            let want = if k == n - 1 {
                if scenario == "die" {
                    Some(3)
                } else {
                    None
                }
            } else {
                Some(0)
            };
            assert_eq!(code, want, "{scenario} n={n}: rank {k}");
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{scenario} n={n} took {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn a_rank_that_never_arrives_fails_the_rendezvous() {
    // A missing non-zero rank: rank 0's store gives up and tells the others;
    // a missing rank 0: the others cannot reach the store.
    for missing in [2, 0] {
        let t = Instant::now();
        let ranks: Vec<usize> = (0..3).filter(|&k| k != missing).collect();
        let codes = wait_all(
            spawn(3, &ranks, "rendezvous", free_port(), FAULT_TIMEOUT),
            Duration::from_secs(20),
            None,
        );
        for (k, code) in codes {
            assert_eq!(code, Some(1), "missing {missing}: rank {k} should fail");
        }
        assert!(
            t.elapsed() < Duration::from_secs_f64(FAULT_TIMEOUT + 6.0),
            "took {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn disagreeing_broadcast_roots_fail_fast() {
    let codes = wait_all(
        spawn(3, &[0, 1, 2], "roots", free_port(), FAIL_FAST_TIMEOUT),
        Duration::from_secs(20),
        None,
    );
    for (k, code) in codes {
        assert_eq!(code, Some(0), "rank {k}");
    }
}

#[test]
fn mismatched_lengths_fail_every_rank() {
    let codes = wait_all(
        spawn(3, &[0, 1, 2], "mismatch", free_port(), FAULT_TIMEOUT),
        Duration::from_secs(20),
        None,
    );
    for (k, code) in codes {
        assert_eq!(code, Some(0), "rank {k}");
    }
}

#[test]
fn launcher_stops_the_others_when_one_fails() {
    let t = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_tessera-run"))
        .args([
            "--nproc-per-node",
            "3",
            "--",
            "sh",
            "-c",
            "if [ $RANK = 1 ]; then exit 5; fi; sleep 30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(5));
    assert!(t.elapsed() < Duration::from_secs(10));
    let out = Command::new(env!("CARGO_BIN_EXE_tessera-run"))
        .args([
            "--nproc-per-node",
            "2",
            "--",
            "sh",
            "-c",
            "echo rank=$RANK of $WORLD_SIZE local=$LOCAL_RANK",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[rank0]: rank=0 of 2 local=0"), "{text}");
    assert!(text.contains("[rank1]: rank=1 of 2 local=1"), "{text}");
}

#[test]
fn stray_clients_of_the_store_neither_block_nor_fail_the_job() {
    use std::io::Write;
    use std::net::TcpStream;
    // Rank 0's store is up once a connection succeeds; this probe hangs up
    // at once, the first stray client. A port from `free_port` can be taken
    // (by another test's client socket) before rank 0 binds it; rank 0 then
    // exits and the test starts over on another port.
    let start_store = || {
        let port = free_port();
        let mut children = spawn(3, &[0], "sum", port, 20.0);
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if children[0].1.try_wait().unwrap().is_some() {
                return None;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "the store never listened");
            std::thread::sleep(Duration::from_millis(5));
        }
        Some((port, children))
    };
    let (port, mut children) = (0..3)
        .find_map(|_| start_store())
        .expect("rank 0 exited before listening, three times");
    // One client that connects and says nothing (held open to the end)...
    let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // ...and one that speaks another protocol and stays connected.
    let mut garbage = TcpStream::connect(("127.0.0.1", port)).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: tessera\r\n\r\n")
        .unwrap();
    let t = Instant::now();
    children.extend(spawn(3, &[1, 2], "sum", port, 20.0));
    for (k, code) in wait_all(children, Duration::from_secs(30), None) {
        assert_eq!(code, Some(0), "rank {k}");
    }
    // Well inside the 20 s rendezvous timeout a blocked store would wait out.
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
}

#[test]
fn launcher_help_exits_zero_and_the_program_needs_no_double_dash() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera-run"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--grace-period"));
    let status = Command::new(env!("CARGO_BIN_EXE_tessera-run"))
        .args(["--nproc-per-node", "2", "/bin/true"])
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
    let out = Command::new(env!("CARGO_BIN_EXE_tessera-run"))
        .args(["--nproc-per-node=2", "sh", "-c", "echo rank=$RANK"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("[rank1]: rank=1"), "{text}");
}

/// Whether process `pid` is gone (no such process, or a zombie nobody reaped).
/// Whether `pid` has exited (or is a zombie) within 5 s. A process the
/// launcher signalled, SIGKILL included, takes a moment to die after the
/// signal is sent, longer on a loaded machine; the launcher does not wait
/// for its ranks' grandchildren.
fn gone(pid: u32) -> bool {
    let dead = || match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dead() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Starts a launcher with 2 ranks running `script` (which must write its
/// pids, one per line, to `$D/$RANK` at once, by a rename), sends it `sig` once both ranks are
/// up, and returns the launcher's status, how long it took to exit after
/// the signal, and the ranks' pids.
fn signal_the_launcher(
    script: &str,
    sig: i32,
    grace: &str,
) -> (std::process::ExitStatus, Duration, Vec<u32>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static RUN: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tessera-run-signal-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_tessera-run"))
        .args([
            "--nproc-per-node",
            "2",
            "--grace-period",
            grace,
            "sh",
            "-c",
            script,
        ])
        .env("D", &dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let read_pids = |rank: usize| -> Option<Vec<u32>> {
        let text = std::fs::read_to_string(dir.join(rank.to_string())).ok()?;
        let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        (!pids.is_empty()).then_some(pids)
    };
    let t = Instant::now();
    let pids = loop {
        if let (Some(a), Some(b)) = (read_pids(0), read_pids(1)) {
            break [a, b].concat();
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the ranks never started");
        std::thread::sleep(Duration::from_millis(10));
    };
    let t = Instant::now();
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(launcher.id() as libc::pid_t, sig) }, 0);
    let status = loop {
        if let Some(s) = launcher.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = launcher.kill();
            panic!("the launcher ignored signal {sig}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = t.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    (status, took, pids)
}

#[test]
fn launcher_forwards_termination_signals_to_every_rank_and_what_it_started() {
    use std::os::unix::process::ExitStatusExt;
    // A rank that is a shell with a sleeping child: SIGTERM must reach both,
    // as it reaches the group on a terminal. (A shell's background job
    // ignores SIGINT, so SIGINT is tried on a rank with no child.)
    let with_child =
        "sleep 30 & echo $! > $D/$RANK.tmp; echo $$ >> $D/$RANK.tmp; mv $D/$RANK.tmp $D/$RANK; wait";
    let alone = "echo $$ > $D/$RANK.tmp; mv $D/$RANK.tmp $D/$RANK; exec sleep 30";
    for (sig, script) in [
        (libc::SIGTERM, with_child),
        (libc::SIGINT, alone),
        (libc::SIGTERM, alone),
    ] {
        // Ranks that obey exit long before the 25 s grace period ends.
        let (status, took, pids) = signal_the_launcher(script, sig, "25");
        assert_eq!(status.signal(), Some(sig), "the launcher's status: {status}");
        assert!(took < Duration::from_secs(12), "signal {sig}: took {took:?}");
        for pid in pids {
            assert!(gone(pid), "signal {sig}: process {pid} outlived the launcher");
        }
    }
}

#[test]
fn launcher_kills_ranks_that_ignore_sigterm_after_the_grace_period() {
    use std::os::unix::process::ExitStatusExt;
    let script = "trap '' TERM; sleep 30 & echo $! > $D/$RANK.tmp; echo $$ >> $D/$RANK.tmp; \
                  mv $D/$RANK.tmp $D/$RANK; wait";
    let (status, took, pids) = signal_the_launcher(script, libc::SIGTERM, "1");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    assert!(
        // Well short of the ranks' 30 s sleep, with room for a loaded machine.
        took >= Duration::from_millis(900) && took < Duration::from_secs(15),
        "took {took:?} with a 1 s grace period"
    );
    for pid in pids {
        assert!(gone(pid), "process {pid} outlived the launcher");
    }
}
