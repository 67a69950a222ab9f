//! The distributed environment a launcher sets: torchrun's variables
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`,
//! `MASTER_ADDR`, `MASTER_PORT`) first, then SLURM's (`SLURM_PROCID`,
//! `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NODEID`, with the master taken
//! from `MASTER_ADDR` or the first host of `SLURM_JOB_NODELIST`), else a
//! single process (spec §2.4).

use std::collections::HashMap;

use crate::error::{CommError, Result};

/// torchrun's default `MASTER_PORT`.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// The largest world size accepted (2^20 ranks): far beyond any job, small
/// enough that per-rank tables stay cheap and the size fits the wire's u32.
pub const MAX_WORLD_SIZE: usize = 1 << 20;

/// Where the settings came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvSource {
    /// torchrun / `tessera-run` variables.
    Torchrun,
    /// SLURM variables (`srun`, no launcher).
    Slurm,
    /// Nothing set: one process.
    Single,
}

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    /// Global rank, `0 .. world_size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// Rank on this node (selects the GPU).
    pub local_rank: usize,
    /// Processes on this node, when known.
    pub local_world_size: Option<usize>,
    /// This node's index.
    pub node_rank: usize,
    /// Host of rank 0's rendezvous store.
    pub master_addr: String,
    /// Port of the rendezvous store.
    pub master_port: u16,
    /// Which variables were read.
    pub source: EnvSource,
}

/// [`detect_from`] over this process's environment.
pub fn detect() -> Result<DistEnv> {
    detect_from(&std::env::vars().collect())
}

/// Reads the distributed settings from `vars` (a pure function, for tests).
/// Errors name the variable when one is malformed, when only one of a
/// required pair is set, when the rank is not below the world size, or when
/// SLURM gives no master host.
pub fn detect_from(vars: &HashMap<String, String>) -> Result<DistEnv> {
    let get = |k: &str| vars.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let num = |k: &str| -> Result<Option<usize>> {
        get(k)
            .map(|v| {
                v.parse::<usize>()
                    .map_err(|_| bad(k, v, "a non-negative integer"))
            })
            .transpose()
    };
    let port = |default: u16| -> Result<u16> {
        get("MASTER_PORT").map_or(Ok(default), |v| {
            v.parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad("MASTER_PORT", v, "a port number in 1..=65535"))
        })
    };
    let env = if get("RANK").is_some() || get("WORLD_SIZE").is_some() {
        let (Some(rank), Some(world_size)) = (num("RANK")?, num("WORLD_SIZE")?) else {
            return Err(CommError::rendezvous(
                "env",
                "RANK and WORLD_SIZE must be set together",
            ));
        };
        DistEnv {
            rank,
            world_size,
            local_rank: num("LOCAL_RANK")?.unwrap_or(0),
            local_world_size: num("LOCAL_WORLD_SIZE")?,
            node_rank: num("GROUP_RANK")?.unwrap_or(0),
            master_addr: get("MASTER_ADDR").unwrap_or("127.0.0.1").to_string(),
            master_port: port(DEFAULT_MASTER_PORT)?,
            source: EnvSource::Torchrun,
        }
    } else if get("SLURM_PROCID").is_some() || get("SLURM_NTASKS").is_some() {
        let (Some(rank), Some(world_size)) = (num("SLURM_PROCID")?, num("SLURM_NTASKS")?) else {
            return Err(CommError::rendezvous(
                "env",
                "SLURM_PROCID and SLURM_NTASKS must be set together",
            ));
        };
        let master_addr = match get("MASTER_ADDR") {
            Some(a) => a.to_string(),
            None => {
                let (var, list) = [
                    ("SLURM_JOB_NODELIST", get("SLURM_JOB_NODELIST")),
                    ("SLURM_NODELIST", get("SLURM_NODELIST")),
                ]
                .into_iter()
                .find_map(|(k, v)| Some((k, v?)))
                .ok_or_else(|| {
                    CommError::rendezvous("env", "under SLURM set MASTER_ADDR or SLURM_JOB_NODELIST")
                })?;
                first_host(list).ok_or_else(|| bad(var, list, "a host list (such as node[01-04],login1)"))?
            }
        };
        // Jobs sharing a node must not share a port: derive it from the job id.
        let default_port = num("SLURM_JOB_ID")?.map_or(DEFAULT_MASTER_PORT, |id| 20000 + (id % 10000) as u16);
        DistEnv {
            rank,
            world_size,
            local_rank: num("SLURM_LOCALID")?.unwrap_or(0),
            local_world_size: num("SLURM_NTASKS_PER_NODE")?,
            node_rank: num("SLURM_NODEID")?.unwrap_or(0),
            master_addr,
            master_port: port(default_port)?,
            source: EnvSource::Slurm,
        }
    } else {
        DistEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: Some(1),
            node_rank: 0,
            master_addr: get("MASTER_ADDR").unwrap_or("127.0.0.1").to_string(),
            master_port: port(DEFAULT_MASTER_PORT)?,
            source: EnvSource::Single,
        }
    };
    check_world("env", env.rank, env.world_size)?;
    Ok(env)
}

/// Checks that `rank` is below `world_size` and the world size is between 1
/// and [`MAX_WORLD_SIZE`]; errors name `op` and the values.
pub(crate) fn check_world(op: &'static str, rank: usize, world_size: usize) -> Result<()> {
    if world_size == 0 || world_size > MAX_WORLD_SIZE {
        return Err(CommError::rendezvous(
            op,
            format!("world size {world_size} is not between 1 and {MAX_WORLD_SIZE}"),
        ));
    }
    if rank >= world_size {
        return Err(CommError::rendezvous(
            op,
            format!("rank {rank} is not below world size {world_size}"),
        ));
    }
    Ok(())
}

fn bad(var: &str, value: &str, want: &str) -> CommError {
    CommError::rendezvous("env", format!("{var}={value:?} is not {want}"))
}

/// The first host of a SLURM node list: `node[01-04,07],gpu2` gives
/// `node01`, `a-[3-5]-ib` gives `a-3-ib`. `None` for an empty list.
pub fn first_host(list: &str) -> Option<String> {
    let mut depth = 0;
    let end = list
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map_or(list.len(), |(i, _)| i);
    let entry = list[..end].trim();
    let host = expand_first(entry)?;
    (!host.is_empty()).then_some(host)
}

/// The first name a bracketed host pattern stands for.
fn expand_first(entry: &str) -> Option<String> {
    let Some(open) = entry.find('[') else {
        return Some(entry.to_string());
    };
    let close = open + entry[open..].find(']')?;
    let inner = &entry[open + 1..close];
    let first = inner.split(',').next()?.split('-').next()?.trim();
    Some(format!(
        "{}{}{}",
        &entry[..open],
        first,
        expand_first(&entry[close + 1..])?
    ))
}
