//! All-reduce bandwidth on `local` (threads) and `tcp` (loopback sockets,
//! one rank per thread), with nccl-tests' definitions: algbw = S/t,
//! busbw = algbw·2(N−1)/N, beside the memory-copy bandwidth measured in the
//! same run. Lines: `bench\tallreduce_<backend>_n<N>_<size>\ttessera\t<metric>\t<v>\t<unit>`.
//! Sizes up to `TESSERA_BENCH_MAX_MB` (default 256). `_nosmall` lines turn off
//! the small-message path (direct exchange), to show what it saves.
//! `TESSERA_BENCH_ONLY=local` or `=tcp` runs one backend.

use std::time::{Duration, Instant};

use tessera_parallel::{tcp, CommConfig, CommExt, Communicator, CpuComm, LocalGroup, ReduceOp};

const KB: usize = 1 << 10;
const MB: usize = 1 << 20;

fn label(bytes: usize) -> String {
    if bytes >= MB {
        format!("{}MB", bytes / MB)
    } else {
        format!("{}KB", bytes / KB)
    }
}

fn line(name: &str, metric: &str, v: f64, unit: &str) {
    println!("bench\t{name}\ttessera\t{metric}\t{v:.3}\t{unit}");
}

/// Bytes per second of `copy_from_slice` on `bytes`, best of a few runs.
fn copy_bandwidth(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    bytes as f64 / best
}

/// Runs every size on every rank; rank 0's mean seconds per all-reduce.
fn measure(comm: &CpuComm, sizes: &[usize]) -> Vec<f64> {
    let mut times = Vec::new();
    let mut buf = vec![1.0f32; sizes.iter().max().copied().unwrap_or(0) / 4];
    for &bytes in sizes {
        let x = &mut buf[..bytes / 4];
        // About 0.5 GB of traffic per size, at least 3 and at most 2000 timed runs.
        let iters = (512 * MB / bytes).clamp(3, 2000);
        comm.all_reduce_slice(x, ReduceOp::Sum).expect("warm-up");
        comm.barrier().expect("barrier");
        let t = Instant::now();
        for _ in 0..iters {
            comm.all_reduce_slice(x, ReduceOp::Sum).expect("all_reduce");
        }
        times.push(t.elapsed().as_secs_f64() / iters as f64);
        comm.barrier().expect("barrier");
    }
    times
}

fn report(backend: &str, n: usize, suffix: &str, sizes: &[usize], times: &[f64]) -> Vec<(usize, f64)> {
    let mut out = Vec::new();
    for (&bytes, &t) in sizes.iter().zip(times) {
        let name = format!("allreduce_{backend}_n{n}_{}{suffix}", label(bytes));
        let algbw = bytes as f64 / t / 1e9;
        let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
        line(&name, "time", t * 1e6, "us");
        line(&name, "algbw", algbw, "GB/s");
        line(&name, "busbw", busbw, "GB/s");
        out.push((bytes, busbw));
    }
    out
}

fn run_local(n: usize, cfg: CommConfig, sizes: &[usize]) -> Vec<f64> {
    let comms = LocalGroup::comms(n, cfg).expect("local group");
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || measure(c, sizes))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank"))
            .next()
            .expect("rank 0")
    })
}

fn run_tcp(n: usize, cfg: CommConfig, sizes: &[usize]) -> Vec<f64> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let cfg = tcp::TcpConfig {
                    master_addr: "127.0.0.1".into(),
                    master_port: port,
                    rank,
                    world_size: n,
                    connect_timeout: Duration::from_secs(30),
                    comm: cfg.clone(),
                };
                s.spawn(move || measure(&tcp::connect(&cfg).expect("tcp rendezvous"), sizes))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank"))
            .next()
            .expect("rank 0")
    })
}

fn main() {
    let only = std::env::var("TESSERA_BENCH_ONLY").unwrap_or_default();
    let max_mb: usize = std::env::var("TESSERA_BENCH_MAX_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let sizes: Vec<usize> = (0..)
        .map(|i| (4 * KB) << (2 * i))
        .take_while(|&b| b <= max_mb * MB)
        .collect();
    let small: Vec<usize> = sizes.iter().copied().filter(|&b| b <= 256 * KB).collect();
    let copy_bytes = (64 * MB).min(max_mb * MB);
    let copy = copy_bandwidth(copy_bytes) / 1e9;
    line(&format!("memcpy_{}", label(copy_bytes)), "copybw", copy, "GB/s");

    let ring_only = CommConfig {
        small_message_bytes: 0,
        ..CommConfig::default()
    };
    let mut local2 = Vec::new();
    let mut tcp2 = Vec::new();
    for n in [2, 4].into_iter().filter(|_| !only.contains("tcp")) {
        let r = report(
            "local",
            n,
            "",
            &sizes,
            &run_local(n, CommConfig::default(), &sizes),
        );
        report(
            "local",
            n,
            "_ring",
            &small,
            &run_local(n, ring_only.clone(), &small),
        );
        if n == 2 {
            local2 = r;
        }
    }
    for n in [2, 4].into_iter().filter(|_| !only.contains("local")) {
        let r = report("tcp", n, "", &sizes, &run_tcp(n, CommConfig::default(), &sizes));
        report("tcp", n, "_nosmall", &small, &run_tcp(n, ring_only.clone(), &small));
        if n == 2 {
            tcp2 = r;
        }
    }
    let local_min = local2
        .iter()
        .filter(|(b, _)| *b >= 16 * MB)
        .map(|(_, v)| *v)
        .fold(f64::INFINITY, f64::min);
    if local_min.is_finite() {
        println!("# bar local n2 >=16MB: min busbw {local_min:.2} GB/s = {:.0}% of copy {copy:.2} GB/s (need >= 50%)", 100.0 * local_min / copy);
    }
    if let Some((_, v)) = tcp2.iter().find(|(b, _)| *b == 64 * MB) {
        println!("# bar tcp n2 64MB: busbw {v:.2} GB/s (need >= 1.00)");
    }
}
