//! The launcher environment (spec §2.4): a pure function over variables.

use std::collections::HashMap;

use tessera_parallel::env::{detect_from, first_host, EnvSource, DEFAULT_MASTER_PORT};

fn vars(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn torchrun_variables() {
    let e = detect_from(&vars(&[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("GROUP_RANK", "1"),
        ("MASTER_ADDR", "10.0.0.7"),
        ("MASTER_PORT", "1234"),
        ("SLURM_PROCID", "0"),
    ]))
    .unwrap();
    assert_eq!(
        (
            e.rank,
            e.world_size,
            e.local_rank,
            e.local_world_size,
            e.node_rank
        ),
        (5, 8, 1, Some(4), 1)
    );
    assert_eq!(
        (e.master_addr.as_str(), e.master_port, e.source),
        ("10.0.0.7", 1234, EnvSource::Torchrun)
    );
    let d = detect_from(&vars(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap();
    assert_eq!(
        (d.master_addr.as_str(), d.master_port),
        ("127.0.0.1", DEFAULT_MASTER_PORT)
    );
}

#[test]
fn slurm_variables() {
    let e = detect_from(&vars(&[
        ("SLURM_PROCID", "3"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "1"),
        ("SLURM_JOB_ID", "123456"),
        ("SLURM_JOB_NODELIST", "gpu[007-009,012],cpu1"),
    ]))
    .unwrap();
    assert_eq!(
        (e.rank, e.world_size, e.local_rank, e.node_rank, e.source),
        (3, 4, 1, 1, EnvSource::Slurm)
    );
    assert_eq!(e.master_addr, "gpu007");
    assert_eq!(e.master_port, 20000 + 3456);
    let m = detect_from(&vars(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "99"),
    ]))
    .unwrap();
    assert_eq!((m.master_addr.as_str(), m.master_port), ("h", 99));
}

#[test]
fn single_process_and_errors() {
    let e = detect_from(&HashMap::new()).unwrap();
    assert_eq!((e.rank, e.world_size, e.source), (0, 1, EnvSource::Single));
    for bad in [
        vec![("RANK", "1")],
        vec![("RANK", "2"), ("WORLD_SIZE", "2")],
        vec![("RANK", "x"), ("WORLD_SIZE", "2")],
        vec![("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "70000")],
        vec![("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")],
        vec![("SLURM_NTASKS", "2")],
    ] {
        let err = detect_from(&vars(&bad)).expect_err("must fail");
        assert!(err.to_string().contains("rendezvous failed"), "{err}");
    }
}

#[test]
fn slurm_node_lists() {
    assert_eq!(first_host("node[01-04,07],gpu2").as_deref(), Some("node01"));
    assert_eq!(first_host("a-[3-5]-ib").as_deref(), Some("a-3-ib"));
    assert_eq!(first_host("n[2-3]-r[08-09]").as_deref(), Some("n2-r08"));
    assert_eq!(first_host("single").as_deref(), Some("single"));
    assert_eq!(first_host("x,y").as_deref(), Some("x"));
    assert_eq!(first_host(""), None);
    assert_eq!(first_host("bad[1-2"), None);
}

#[test]
fn absurd_world_sizes_and_ports_are_errors() {
    let t = std::time::Instant::now();
    // 2^32 + 2 used to abort rank 0 (a table of that many entries) and go
    // on the wire truncated to u32; 10^8 took 14 s before failing.
    for world in ["4294967298", "100000000", "1048577", "0"] {
        let e = detect_from(&vars(&[("RANK", "0"), ("WORLD_SIZE", world)]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("world size {world}")) && e.contains("1048576"),
            "{e}"
        );
    }
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    let ok = detect_from(&vars(&[("RANK", "3"), ("WORLD_SIZE", "1048576")])).unwrap();
    assert_eq!(ok.world_size, 1 << 20);
    for port in ["0", "65536", "-1", "http"] {
        let e = detect_from(&vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", port),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("MASTER_PORT") && e.contains(port), "{e}");
    }
    // A TcpConfig built by hand is checked the same way.
    let cfg = tessera_parallel::tcp::TcpConfig {
        master_addr: "127.0.0.1".into(),
        master_port: DEFAULT_MASTER_PORT,
        rank: 0,
        world_size: 1 << 33,
        connect_timeout: std::time::Duration::from_secs(1),
        comm: Default::default(),
    };
    let e = tessera_parallel::tcp::connect(&cfg)
        .err()
        .expect("an error")
        .to_string();
    assert!(e.contains("world size 8589934592"), "{e}");
}

#[test]
fn a_malformed_slurm_node_list_is_named() {
    for list in ["node[01-04", "[]"] {
        let e = detect_from(&vars(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", list),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("SLURM_JOB_NODELIST") && e.contains(list) && !e.contains("set MASTER_ADDR"),
            "{e}"
        );
    }
}
