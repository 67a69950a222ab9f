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

/// Seconds of one `copy_from_slice` of `src`, best of a few runs.
fn copy_time(src: &[f32], dst: &mut [f32]) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(src));
        std::hint::black_box(&mut *dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

/// Runs every size on every rank; rank 0's mean seconds per all-reduce,
/// and the seconds of a memory copy of the same size, timed on rank 0 just
/// before (so that both see the same machine load).
fn measure(comm: &CpuComm, sizes: &[usize]) -> Vec<(f64, f64)> {
    let mut times = Vec::new();
    let max = sizes.iter().max().copied().unwrap_or(0) / 4;
    let mut buf = vec![1.0f32; max];
    let mut spare = if comm.rank() == 0 {
        vec![0.0f32; max]
    } else {
        Vec::new()
    };
    for &bytes in sizes {
        let x = &mut buf[..bytes / 4];
        // About 2 GB of traffic per size, at least 5 and at most 5000 timed runs.
        let iters = (2048 * MB / bytes).clamp(5, 5000);
        comm.all_reduce_slice(x, ReduceOp::Sum).expect("warm-up");
        let copy = if comm.rank() == 0 {
            copy_time(x, &mut spare[..bytes / 4])
        } else {
            0.0
        };
        comm.barrier().expect("barrier");
        let t = Instant::now();
        for _ in 0..iters {
            comm.all_reduce_slice(x, ReduceOp::Sum).expect("all_reduce");
        }
        times.push((t.elapsed().as_secs_f64() / iters as f64, copy));
        comm.barrier().expect("barrier");
    }
    times
}

/// Prints the lines of one backend and group size; returns (bytes, busbw,
/// copy bandwidth) per size.
fn report(
    backend: &str,
    n: usize,
    suffix: &str,
    sizes: &[usize],
    times: &[(f64, f64)],
) -> Vec<(usize, f64, f64)> {
    let mut out = Vec::new();
    for (&bytes, &(t, copy_t)) in sizes.iter().zip(times) {
        let name = format!("allreduce_{backend}_n{n}_{}{suffix}", label(bytes));
        let algbw = bytes as f64 / t / 1e9;
        let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
        let copybw = bytes as f64 / copy_t / 1e9;
        line(&name, "time", t * 1e6, "us");
        line(&name, "algbw", algbw, "GB/s");
        line(&name, "busbw", busbw, "GB/s");
        line(&name, "copybw", copybw, "GB/s");
        out.push((bytes, busbw, copybw));
    }
    out
}

fn run_local(n: usize, cfg: CommConfig, sizes: &[usize]) -> Vec<(f64, f64)> {
    let comms = LocalGroup::comms(n, cfg).expect("local group");
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || measure(c, sizes))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank"))
            .next()
            .expect("rank 0")
    })
}

fn run_tcp(n: usize, cfg: CommConfig, sizes: &[usize]) -> Vec<(f64, f64)> {
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
    // A whole-run reference copy too; the bar uses the copy timed beside each size.
    let copy_bytes = (64 * MB).min(max_mb * MB);
    let src = vec![1.0f32; copy_bytes / 4];
    let mut dst = vec![0.0f32; copy_bytes / 4];
    line(
        &format!("memcpy_{}", label(copy_bytes)),
        "copybw",
        copy_bytes as f64 / copy_time(&src, &mut dst) / 1e9,
        "GB/s",
    );
    drop((src, dst));

    let no_small = CommConfig {
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
            "_nosmall",
            &small,
            &run_local(n, no_small.clone(), &small),
        );
        if n == 2 {
            local2 = r;
        }
    }
    for n in [2, 4].into_iter().filter(|_| !only.contains("local")) {
        let r = report("tcp", n, "", &sizes, &run_tcp(n, CommConfig::default(), &sizes));
        report(
            "tcp",
            n,
            "_nosmall",
            &small,
            &run_tcp(n, no_small.clone(), &small),
        );
        if n == 2 {
            tcp2 = r;
        }
    }
    let worst = local2
        .iter()
        .filter(|(b, _, _)| *b >= 16 * MB)
        .map(|&(b, bus, copy)| (bus / copy, b, bus, copy))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((ratio, b, bus, copy)) = worst {
        println!(
            "# bar local n2 >=16MB: worst {} busbw {bus:.2} GB/s = {:.0}% of copy {copy:.2} GB/s (need >= 50%)",
            label(b),
            100.0 * ratio
        );
    }
    if let Some((_, v, _)) = tcp2.iter().find(|(b, _, _)| *b == 64 * MB) {
        println!("# bar tcp n2 64MB: busbw {v:.2} GB/s (need >= 1.00)");
    }
}
