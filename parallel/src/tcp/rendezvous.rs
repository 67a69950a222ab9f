//! Rendezvous over TCP: rank 0 runs a store on `MASTER_ADDR:MASTER_PORT`
//! that collects every rank's data address and hands out the table; then
//! the ranks connect in a full mesh (rank i dials every j < i). Every step
//! has a deadline; a rank that never arrives fails the whole rendezvous on
//! every rank that did. Connections are greeted concurrently, each within
//! a few seconds, and a client that is not a tessera rank of this job (a
//! port scanner, a health check, a stale rank of an earlier run) is dropped,
//! so a stray connection to `MASTER_PORT` neither blocks nor fails the job.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::ops::ControlFlow;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};

const MAGIC: u32 = 0x7E55_0001;
const POLL: Duration = Duration::from_millis(2);
/// How long an accepted connection may take to send its greeting: a rank
/// sends it as soon as it connects, so only a stray client is this slow.
const HANDSHAKE: Duration = Duration::from_secs(5);
/// Greetings read at once; more connections wait in the listen backlog.
const MAX_HANDSHAKES: usize = 64;

/// Resolves `host:port` (a name or an address).
pub(crate) fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| CommError::rendezvous("resolve", format!("{host}:{port}: {e}")))?
        .next()
        .ok_or_else(|| CommError::rendezvous("resolve", format!("{host}:{port} has no address")))
}

/// The streams to every peer (`None` at this rank's own index).
pub(crate) fn rendezvous(
    master: SocketAddr,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> Result<Vec<Option<TcpStream>>> {
    let deadline = crate::group::deadline_after(timeout);
    // Data connections use the interface that reaches the master.
    let bind_ip = if master.ip().is_loopback() {
        master.ip()
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let data = TcpListener::bind((bind_ip, 0)).map_err(|e| CommError::io("rendezvous: bind", e))?;
    let data_port = data
        .local_addr()
        .map_err(|e| CommError::io("rendezvous", e))?
        .port();
    let (nonce, table) = if rank == 0 {
        run_store(master, world, data_port, deadline)?
    } else {
        register(master, rank, world, data_port, deadline)?
    };
    mesh(&data, &table, rank, nonce, deadline)
}

/// Rank 0: accepts `world - 1` registrations, then answers each with the table.
fn run_store(
    master: SocketAddr,
    world: usize,
    data_port: u16,
    deadline: Instant,
) -> Result<(u64, Vec<SocketAddr>)> {
    let bind = if master.ip().is_loopback() {
        master
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), master.port())
    };
    let store = TcpListener::bind(bind)
        .map_err(|e| CommError::rendezvous("store", format!("cannot listen on {bind}: {e}")))?;
    let mut table: Vec<Option<SocketAddr>> = vec![None; world];
    table[0] = Some(SocketAddr::new(master.ip(), data_port));
    let mut clients = Vec::new();
    let mut failure = None;
    let complete = gather(&store, deadline, read_registration, |reg, s| {
        clients.push(s);
        match check_registration(reg, world) {
            Ok((k, addr)) if table[k].is_none() => {
                table[k] = Some(addr);
                if table.iter().all(Option::is_some) {
                    return ControlFlow::Break(());
                }
                ControlFlow::Continue(())
            }
            Ok((k, _)) => {
                failure = Some(format!("rank {k} registered twice"));
                ControlFlow::Break(())
            }
            Err(msg) => {
                failure = Some(msg);
                ControlFlow::Break(())
            }
        }
    })?;
    if !complete {
        let missing: Vec<usize> = (0..world).filter(|&k| table[k].is_none()).collect();
        failure = Some(format!(
            "ranks {missing:?} of {world} did not arrive before the timeout"
        ));
    }
    let nonce = ((std::process::id() as u64) << 32) ^ seed_from_time();
    let mut reply = Vec::new();
    match &failure {
        None => {
            reply.push(0u8);
            reply.extend_from_slice(&nonce.to_le_bytes());
            for a in table.iter().flatten() {
                put_addr(&mut reply, a);
            }
        }
        Some(msg) => {
            reply.push(1u8);
            reply.extend_from_slice(&(msg.len() as u32).to_le_bytes());
            reply.extend_from_slice(msg.as_bytes());
        }
    }
    for mut c in clients {
        // A client that went away meanwhile learns nothing either way.
        let _ = c.write_all(&reply);
    }
    match failure {
        Some(msg) => Err(CommError::rendezvous("store", msg)),
        None => Ok((nonce, table.into_iter().flatten().collect())),
    }
}

fn seed_from_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// What a rank announces to the store: its rank, its world size and the
/// address of its data listener (the IP the client reached us from, its port).
struct Registration {
    rank: u32,
    world: u32,
    addr: SocketAddr,
}

/// Reads one registration (magic, rank, world, data port); `None` for a
/// client that is not a tessera rank (wrong magic, silence, hang-up).
fn read_registration(s: &mut TcpStream, deadline: Instant) -> Option<Registration> {
    let ip = s.peer_addr().ok()?.ip();
    let mut b = [0u8; 14];
    read_until(s, &mut b, deadline).ok()?;
    let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    (word(0) == MAGIC).then(|| Registration {
        rank: word(4),
        world: word(8),
        addr: SocketAddr::new(ip, u16::from_le_bytes([b[12], b[13]])),
    })
}

/// A registration from a tessera rank that does not fit this job is an
/// error for the whole job (a misconfigured launch, not a stray client).
fn check_registration(reg: Registration, world: usize) -> std::result::Result<(usize, SocketAddr), String> {
    let (rank, their_world) = (reg.rank as usize, reg.world as usize);
    if their_world != world {
        return Err(format!(
            "rank {rank} has world size {their_world}, rank 0 has {world}"
        ));
    }
    if rank == 0 || rank >= world {
        return Err(format!("a rank registered as {rank}, outside 1..{world}"));
    }
    Ok((rank, reg.addr))
}

/// Serves `listener` until `take` breaks (`Ok(true)`) or the deadline
/// passes (`Ok(false)`). Every connection reads its greeting on its own
/// thread within [`HANDSHAKE`], so a silent client delays nobody; a
/// connection whose `greet` gives `None` (not one of ours) is dropped.
/// Accepted greetings reach `take` in the order they complete.
fn gather<T: Send + 'static>(
    listener: &TcpListener,
    deadline: Instant,
    greet: impl Fn(&mut TcpStream, Instant) -> Option<T> + Send + Sync + 'static,
    mut take: impl FnMut(T, TcpStream) -> ControlFlow<()>,
) -> Result<bool> {
    listener
        .set_nonblocking(true)
        .map_err(|e| CommError::io("rendezvous: accept", e))?;
    let greet = Arc::new(greet);
    let (tx, rx) = mpsc::channel::<Option<(T, TcpStream)>>();
    let mut in_flight = 0usize;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        // Past the cap, connections wait in the kernel's backlog until a
        // handshake ends, so a flood costs threads only up to the cap.
        if in_flight < MAX_HANDSHAKES {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false)
                        .map_err(|e| CommError::io("rendezvous: accept", e))?;
                    let (greet, tx) = (Arc::clone(&greet), tx.clone());
                    let until = deadline.min(now + HANDSHAKE);
                    in_flight += 1;
                    std::thread::spawn(move || {
                        let got = greet(&mut s, until).map(|g| (g, s));
                        // The gatherer may have finished; then nobody listens.
                        let _ = tx.send(got);
                    });
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(CommError::io("rendezvous: accept", e)),
            }
        }
        // A timeout is the only error: `tx` lives here, so the channel
        // never disconnects.
        if let Ok(got) = rx.recv_timeout(POLL) {
            in_flight -= 1;
            if let Some((g, s)) = got {
                if take(g, s).is_break() {
                    return Ok(true);
                }
            }
        }
    }
}

/// Ranks > 0: registers with the store (retrying until it listens) and
/// waits for the table.
fn register(
    master: SocketAddr,
    rank: usize,
    world: usize,
    data_port: u16,
    deadline: Instant,
) -> Result<(u64, Vec<SocketAddr>)> {
    let mut s = connect_until(master, deadline, "store")?;
    let mut msg = Vec::with_capacity(14);
    msg.extend_from_slice(&MAGIC.to_le_bytes());
    msg.extend_from_slice(&(rank as u32).to_le_bytes());
    msg.extend_from_slice(&(world as u32).to_le_bytes());
    msg.extend_from_slice(&data_port.to_le_bytes());
    s.write_all(&msg)
        .map_err(|e| CommError::io("rendezvous: register", e))?;
    let fail = |e: String| {
        CommError::rendezvous(
            "register",
            format!("rank {rank}: no answer from the store at {master}: {e}"),
        )
    };
    let mut status = [0u8; 1];
    read_until(&mut s, &mut status, deadline).map_err(fail)?;
    if status[0] != 0 {
        let mut len = [0u8; 4];
        read_until(&mut s, &mut len, deadline).map_err(fail)?;
        let mut text = vec![0u8; (u32::from_le_bytes(len) as usize).min(1 << 16)];
        read_until(&mut s, &mut text, deadline).map_err(fail)?;
        return Err(CommError::rendezvous(
            "register",
            String::from_utf8_lossy(&text).into_owned(),
        ));
    }
    let mut nonce = [0u8; 8];
    read_until(&mut s, &mut nonce, deadline).map_err(fail)?;
    let table = (0..world)
        .map(|_| get_addr(&mut s, deadline).map_err(fail))
        .collect::<Result<Vec<_>>>()?;
    Ok((u64::from_le_bytes(nonce), table))
}

/// The full mesh: dial lower ranks, accept higher ones, each connection
/// opened by a hello (magic, nonce, rank).
fn mesh(
    data: &TcpListener,
    table: &[SocketAddr],
    rank: usize,
    nonce: u64,
    deadline: Instant,
) -> Result<Vec<Option<TcpStream>>> {
    let world = table.len();
    let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    for (j, addr) in table.iter().enumerate().take(rank) {
        let mut s = connect_until(*addr, deadline, "mesh")?;
        let mut hello = Vec::with_capacity(16);
        hello.extend_from_slice(&MAGIC.to_le_bytes());
        hello.extend_from_slice(&nonce.to_le_bytes());
        hello.extend_from_slice(&(rank as u32).to_le_bytes());
        s.write_all(&hello)
            .map_err(|e| CommError::io("rendezvous: mesh", e))?;
        peers[j] = Some(s);
    }
    // Stray or stale connections (another job, a previous run) are dropped.
    let hello = move |s: &mut TcpStream, until: Instant| {
        let mut b = [0u8; 16];
        read_until(s, &mut b, until).ok()?;
        let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let their_nonce = u64::from_le_bytes(b[4..12].try_into().ok()?);
        let j = u32::from_le_bytes([b[12], b[13], b[14], b[15]]) as usize;
        (magic == MAGIC && their_nonce == nonce && j > rank && j < world).then_some(j)
    };
    let all_higher = |peers: &[Option<TcpStream>]| (rank + 1..world).all(|j| peers[j].is_some());
    if !all_higher(&peers) {
        let complete = gather(data, deadline, hello, |j, s| {
            if peers[j].is_none() {
                peers[j] = Some(s);
            }
            if all_higher(&peers) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if !complete {
            let missing: Vec<usize> = (rank + 1..world).filter(|&j| peers[j].is_none()).collect();
            return Err(CommError::rendezvous(
                "mesh",
                format!("rank {rank}: ranks {missing:?} never connected"),
            ));
        }
    }
    for s in peers.iter().flatten() {
        s.set_nodelay(true).map_err(|e| CommError::io("rendezvous", e))?;
        s.set_read_timeout(None)
            .map_err(|e| CommError::io("rendezvous", e))?;
    }
    Ok(peers)
}

fn connect_until(addr: SocketAddr, deadline: Instant, what: &'static str) -> Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CommError::rendezvous(
                what,
                format!("could not connect to {addr} before the timeout"),
            ));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
            Ok(s) => return Ok(s),
            Err(_) => std::thread::sleep(Duration::from_millis(20).min(left)),
        }
    }
}

fn read_until(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::result::Result<(), String> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err("timed out".into());
    }
    s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
    s.read_exact(buf).map_err(|e| e.to_string())
}

fn put_addr(out: &mut Vec<u8>, a: &SocketAddr) {
    let ip = a.ip().to_string();
    out.push(ip.len() as u8);
    out.extend_from_slice(ip.as_bytes());
    out.extend_from_slice(&a.port().to_le_bytes());
}

fn get_addr(s: &mut TcpStream, deadline: Instant) -> std::result::Result<SocketAddr, String> {
    let mut len = [0u8; 1];
    read_until(s, &mut len, deadline)?;
    let mut ip = vec![0u8; len[0] as usize];
    read_until(s, &mut ip, deadline)?;
    let mut port = [0u8; 2];
    read_until(s, &mut port, deadline)?;
    let ip: IpAddr = String::from_utf8_lossy(&ip)
        .parse()
        .map_err(|_| "malformed address table".to_string())?;
    Ok(SocketAddr::new(ip, u16::from_le_bytes(port)))
}
