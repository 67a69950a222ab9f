//! `examples/train_mnist --pipeline-stages 2`: one stage per process over
//! `tcp` (as `tessera-run --nproc-per-node 2` starts it) trains to the same
//! bits as the two stages on threads. The test binary re-executes itself as
//! the two ranks, with the environment `tessera-run` gives them.

use crate::train_mnist_example::{cli, pipeline};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set in the ranks this test starts: the output directory.
const CHILD: &str = "TESSERA_TEST_PIPELINE_OUT";

/// Four steps (the fewest one-cycle accepts) of a 2-stage 1F1B pipeline
/// with 4 micro-batches.
fn args(out: &Path) -> cli::Args {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/datasets/mnist");
    let flags = [
        "--epochs",
        "1",
        "--batch-size",
        "64",
        "--lr",
        "0.05",
        "--seed",
        "5",
        "--train-limit",
        "256",
        "--test-limit",
        "100",
        "--pipeline-stages",
        "2",
        "--micro-batches",
        "4",
        "--schedule",
        "1f1b",
        "--data",
        data,
        "--out",
    ];
    let all = flags
        .iter()
        .map(|s| s.to_string())
        .chain([out.display().to_string()]);
    cli::Args::parse(all).unwrap()
}

/// Runs one rank when started by the test below; a no-op otherwise.
#[test]
fn pipeline_rank_entry() {
    let Some(out) = std::env::var_os(CHILD) else {
        return;
    };
    let code = match pipeline::train(&args(Path::new(&out))) {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("rank failed: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-pipe-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The metrics of the log, without the timings.
fn metrics(out: &Path) -> Vec<String> {
    let log = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    log.lines()
        .map(|l| {
            l.split(',')
                .filter(|f| !f.contains("samples_per_s") && !f.contains("elapsed_s"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

#[test]
fn a_pipeline_over_tcp_processes_trains_to_the_bits_of_threads() {
    let threads = tmp("threads");
    pipeline::train(&args(&threads)).unwrap();

    let procs = tmp("processes");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let exe = std::env::current_exe().unwrap();
    let mut ranks: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "train_mnist_pipeline::pipeline_rank_entry",
                    "--nocapture",
                ])
                .args(["--test-threads", "1"])
                .env(CHILD, &procs)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("TESSERA_COMM_TIMEOUT", "60")
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let t = Instant::now();
    let mut codes = [None, None];
    while codes.iter().any(Option::is_none) && t.elapsed() < Duration::from_secs(120) {
        for (k, r) in ranks.iter_mut().enumerate() {
            if codes[k].is_none() {
                codes[k] = r.try_wait().unwrap().map(|s| s.code());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for r in &mut ranks {
        let _ = r.kill();
        let _ = r.wait();
    }
    assert_eq!(codes, [Some(Some(0)), Some(Some(0))], "the ranks' exit codes");
    let weights = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert!(weights(&threads) == weights(&procs), "the weights differ");
    assert_eq!(metrics(&threads), metrics(&procs));
    let _ = std::fs::remove_dir_all(&threads);
    let _ = std::fs::remove_dir_all(&procs);
}
