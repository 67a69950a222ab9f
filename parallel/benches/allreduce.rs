//! All-reduce bandwidth on `local` (threads) and `tcp` (loopback sockets,
//! one rank per thread), with nccl-tests' definitions: algbw = S/t,
//! busbw = algbw·2(N−1)/N, beside the memory-copy bandwidth measured in the
//! same run. Lines: `bench\tallreduce_<backend>_n<N>_<size>\ttessera\t<metric>\t<v>\t<unit>`.
//! Sizes up to `TESSERA_BENCH_MAX_MB` (default 256). Each size runs in
//! [`ROUNDS`] rounds of a copy batch then an all-reduce batch: `busbw` and
//! `copybw` are the best rounds, `busbw_mean` and `copybw_mean` the means,
//! `copybw_single` the best of 5 single copies of a cache-warm source.
//! `_ring` lines run `local` through the message-passing ring (as over
//! TCP) instead of shared memory; `_nosmall` lines turn off the TCP
//! small-message path (direct exchange), to show what it saves.
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
    (0..5).map(|_| copy_mean(src, dst, 1)).fold(f64::MAX, f64::min)
}

/// Mean seconds of `iters` copies of `src` into `dst`.
fn copy_mean(src: &[f32], dst: &mut [f32], iters: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        dst.copy_from_slice(std::hint::black_box(src));
        std::hint::black_box(&mut *dst);
    }
    t.elapsed().as_secs_f64() / iters as f64
}

/// Timed rounds per size: the machine is shared, so each round times a
/// batch of memory copies (rank 0) and then a batch of all-reduces of the
/// same size back to back, and the lines give the best round of each (the
/// same estimator for both) and the mean over all rounds.
const ROUNDS: usize = 5;

/// Seconds per operation of one size: best round and mean of all rounds,
/// for the all-reduce and for the copy.
#[derive(Clone, Copy, Default)]
struct Times {
    best: f64,
    mean: f64,
    copy_best: f64,
    copy_mean: f64,
    /// Best of 5 single copies right after the warm-up all-reduce (the
    /// source is then cache-warm): the estimator of earlier versions.
    copy_single: f64,
}

/// Runs every size on every rank; rank 0's [`Times`] per size.
fn measure(comm: &CpuComm, sizes: &[usize]) -> Vec<Times> {
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
        // About 2 GB of all-reduce traffic per size, at least 2 runs per round.
        let iters = (2048 * MB / bytes / ROUNDS).clamp(2, 1000);
        comm.all_reduce_slice(x, ReduceOp::Sum).expect("warm-up");
        let mut t = Times {
            best: f64::MAX,
            copy_best: f64::MAX,
            ..Times::default()
        };
        if comm.rank() == 0 {
            t.copy_single = copy_time(x, &mut spare[..bytes / 4]);
        }
        for _ in 0..ROUNDS {
            if comm.rank() == 0 {
                let c = copy_mean(x, &mut spare[..bytes / 4], iters);
                t.copy_best = t.copy_best.min(c);
                t.copy_mean += c / ROUNDS as f64;
            }
            comm.barrier().expect("barrier");
            let start = Instant::now();
            for _ in 0..iters {
                comm.all_reduce_slice(x, ReduceOp::Sum).expect("all_reduce");
            }
            let a = start.elapsed().as_secs_f64() / iters as f64;
            t.best = t.best.min(a);
            t.mean += a / ROUNDS as f64;
        }
        times.push(t);
        comm.barrier().expect("barrier");
    }
    times
}

/// Bus and copy bandwidths (GB/s) of one size.
struct Bw {
    bytes: usize,
    best: (f64, f64),
    mean: (f64, f64),
    single: (f64, f64),
}

/// Prints the lines of one backend and group size; returns (bytes, busbw,
/// copy bandwidth) per size.
fn report(backend: &str, n: usize, suffix: &str, sizes: &[usize], times: &[Times]) -> Vec<Bw> {
    let mut out = Vec::new();
    let bw = |bytes: usize, t: f64| bytes as f64 / t / 1e9;
    for (&bytes, t) in sizes.iter().zip(times) {
        let name = format!("allreduce_{backend}_n{n}_{}{suffix}", label(bytes));
        let factor = 2.0 * (n - 1) as f64 / n as f64;
        let busbw = bw(bytes, t.best) * factor;
        let copybw = bw(bytes, t.copy_best);
        line(&name, "time", t.best * 1e6, "us");
        line(&name, "algbw", bw(bytes, t.best), "GB/s");
        line(&name, "busbw", busbw, "GB/s");
        line(&name, "copybw", copybw, "GB/s");
        let (busbw_mean, copybw_mean) = (bw(bytes, t.mean) * factor, bw(bytes, t.copy_mean));
        line(&name, "busbw_mean", busbw_mean, "GB/s");
        line(&name, "copybw_mean", copybw_mean, "GB/s");
        let copybw_single = bw(bytes, t.copy_single);
        line(&name, "copybw_single", copybw_single, "GB/s");
        out.push(Bw {
            bytes,
            best: (busbw, copybw),
            mean: (busbw_mean, copybw_mean),
            single: (busbw, copybw_single),
        });
    }
    out
}

fn run_local(n: usize, cfg: CommConfig, sizes: &[usize]) -> Vec<Times> {
    let comms = LocalGroup::comms(n, cfg).expect("local group");
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || measure(c, sizes))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank"))
            .next()
            .expect("rank 0")
    })
}

fn run_tcp(n: usize, cfg: CommConfig, sizes: &[usize]) -> Vec<Times> {
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
    let ring = CommConfig {
        shared_memory: false,
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
        report("local", n, "_ring", &sizes, &run_local(n, ring.clone(), &sizes));
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
    for (what, pick) in [
        ("best rounds", (|b: &Bw| b.best) as fn(&Bw) -> (f64, f64)),
        ("round means", |b: &Bw| b.mean),
        ("best round vs single warm copy", |b: &Bw| b.single),
    ] {
        let worst = local2
            .iter()
            .filter(|b| b.bytes >= 16 * MB)
            .map(|b| (pick(b), b.bytes))
            .min_by(|a, b| (a.0 .0 / a.0 .1).total_cmp(&(b.0 .0 / b.0 .1)));
        if let Some(((bus, copy), b)) = worst {
            println!(
                "# bar local n2 >=16MB ({what}): worst {} busbw {bus:.2} GB/s = {:.0}% of copy {copy:.2} GB/s (need >= 50%)",
                label(b),
                100.0 * bus / copy
            );
        }
    }
    if let Some(b) = tcp2.iter().find(|b| b.bytes == 64 * MB) {
        println!("# bar tcp n2 64MB: busbw {:.2} GB/s (need >= 1.00)", b.best.0);
    }
}
