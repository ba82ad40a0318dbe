//! The multi-node bootstrap of tensor parallelism: node 0 makes the NCCL unique id and hands
//! it to every other node over TCP (`--nnodes --node-rank --master-addr`), the way NCCL's own
//! examples and `torchrun` do it. After that NCCL connects the ranks itself (its standard
//! bootstrap, from the id); this module only moves 128 bytes, needs no GPU and no NCCL, and is
//! tested on the CPU.
//!
//! Protocol (version 1), one TCP connection per non-zero node:
//! - node `r` → node 0: `KERNTP01`, `r` (u32 LE), `nnodes` (u32 LE), the job key (u64 LE: a
//!   fingerprint of what every node runs, e.g. the manifest's hash and the sizes, so a node
//!   started with another model or size is refused instead of joining);
//! - node 0 waits until every node `1..nnodes` has said hello, then answers all at once: `0`
//!   and the 128-byte id, or — when any hello was wrong (another key, a node rank twice or
//!   out of range) — `1`, a u32 LE length and the reason, to every node. All or nothing: no
//!   node goes on into NCCL's initialization when one was refused.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The port node 0 listens on when `--master-addr` gives none (torchrun's default).
pub const DEFAULT_PORT: u16 = 29500;
const MAGIC: &[u8; 8] = b"KERNTP01";
/// The size of the payload (NCCL's unique id).
pub const ID_BYTES: usize = 128;
const MAX_REASON: u32 = 4096;

/// What every node of one job agrees on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    /// Nodes (processes) in the job, ≥ 1.
    pub nnodes: u32,
    /// A fingerprint of what every node runs; nodes with another key are refused.
    pub key: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("bootstrap: {what}: {cause}")]
    Io { what: String, cause: std::io::Error },
    #[error("bootstrap: {0}")]
    Timeout(String),
    /// Node 0 refused this node, or another node (the reason says which and why).
    #[error("bootstrap: refused by node 0: {0}")]
    Refused(String),
    /// Node 0 refused a node that said hello (this is node 0's side of it).
    #[error("bootstrap: {0}")]
    BadNode(String),
    #[error("bootstrap: {0}")]
    Config(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BootstrapError {
    let what = what.into();
    move |cause| BootstrapError::Io { what, cause }
}

/// `host:port`, or `host` with [`DEFAULT_PORT`]; resolved (the first address).
pub fn master_addr(s: &str) -> Result<SocketAddr, BootstrapError> {
    let with_port = if s.parse::<SocketAddr>().is_ok() || s.rsplit_once(':').is_some_and(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok()) {
        s.to_string()
    } else {
        format!("{s}:{DEFAULT_PORT}")
    };
    with_port
        .to_socket_addrs()
        .map_err(|e| BootstrapError::Config(format!("--master-addr `{s}`: {e}")))?
        .next()
        .ok_or_else(|| BootstrapError::Config(format!("--master-addr `{s}` resolves to no address")))
}

/// Node 0's listening socket (bound before the other nodes start, or while they retry).
#[derive(Debug)]
pub struct Master {
    listener: TcpListener,
}

struct Hello {
    node_rank: u32,
    nnodes: u32,
    key: u64,
}

impl Master {
    /// Listens on `addr` (node 0's `--master-addr`; port 0 picks a free port).
    pub fn bind(addr: SocketAddr) -> Result<Master, BootstrapError> {
        let listener = TcpListener::bind(addr).map_err(io(format!("listening on {addr} (node 0's --master-addr)")))?;
        Ok(Master { listener })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, BootstrapError> {
        self.listener.local_addr().map_err(io("reading the listening address"))
    }

    /// Waits (until `timeout`) for every node `1..nnodes`, then sends them `id` — or, when a
    /// node's hello is wrong, the reason to all of them and an error here.
    pub fn serve(self, job: &Job, id: &[u8; ID_BYTES], timeout: Duration) -> Result<(), BootstrapError> {
        if job.nnodes == 0 {
            return Err(BootstrapError::Config("--nnodes is at least 1".into()));
        }
        let deadline = Instant::now() + timeout;
        self.listener.set_nonblocking(true).map_err(io("setting up the listener"))?;
        let mut peers: Vec<(TcpStream, u32)> = vec![];
        let mut problems: Vec<String> = vec![];
        while peers.len() + problems.len() < job.nnodes as usize - 1 {
            let (mut s, from) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let mut joined: Vec<u32> = peers.iter().map(|p| p.1).collect();
                        joined.sort_unstable();
                        let missing: Vec<String> = (1..job.nnodes).filter(|r| !joined.contains(r)).map(|r| r.to_string()).collect();
                        let reason = format!("node(s) {} did not join within {:?}: start them with --nnodes {} --node-rank R --master-addr {}", missing.join(", "), timeout, job.nnodes, self.local_addr().map(|a| a.to_string()).unwrap_or_default());
                        for (p, _) in &mut peers {
                            let _ = refuse(p, &reason);
                        }
                        return Err(BootstrapError::Timeout(reason));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(io("accepting a node")(e)),
            };
            s.set_nonblocking(false).map_err(io("setting up a connection"))?;
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
            s.set_read_timeout(Some(left)).map_err(io("setting up a connection"))?;
            match read_hello(&mut s) {
                Err(e) => problems.push(format!("a connection from {from} is not a kern node: {e}")),
                Ok(h) => {
                    let bad = if h.nnodes != job.nnodes {
                        Some(format!("node {} from {from} was started with --nnodes {}, node 0 with {}", h.node_rank, h.nnodes, job.nnodes))
                    } else if h.key != job.key {
                        Some(format!("node {} from {from} runs another job (key {:016x}, node 0's {:016x}): start every node with the same model and sizes", h.node_rank, h.key, job.key))
                    } else if h.node_rank == 0 || h.node_rank >= job.nnodes {
                        Some(format!("node rank {} from {from} is outside 1..{}", h.node_rank, job.nnodes))
                    } else if peers.iter().any(|p| p.1 == h.node_rank) {
                        Some(format!("node rank {} joined twice (again from {from})", h.node_rank))
                    } else {
                        None
                    };
                    match bad {
                        Some(why) => {
                            let _ = refuse(&mut s, &why);
                            problems.push(why);
                        }
                        None => peers.push((s, h.node_rank)),
                    }
                }
            }
        }
        if !problems.is_empty() {
            let reason = problems.join("; ");
            for (p, _) in &mut peers {
                let _ = refuse(p, &reason);
            }
            return Err(BootstrapError::BadNode(reason));
        }
        for (p, r) in &mut peers {
            let mut msg = vec![0u8];
            msg.extend_from_slice(id);
            p.write_all(&msg).map_err(io(format!("sending the id to node {r}")))?;
        }
        Ok(())
    }
}

fn refuse(s: &mut TcpStream, why: &str) -> std::io::Result<()> {
    let bytes = &why.as_bytes()[..why.len().min(MAX_REASON as usize)];
    let mut msg = vec![1u8];
    msg.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    msg.extend_from_slice(bytes);
    s.write_all(&msg)
}

fn read_hello(s: &mut TcpStream) -> std::io::Result<Hello> {
    let mut b = [0u8; 24];
    s.read_exact(&mut b)?;
    if &b[..8] != MAGIC {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "wrong greeting"));
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    Ok(Hello { node_rank: u32_at(8), nnodes: u32_at(12), key: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")) })
}

/// Node `node_rank` (≥ 1): connects to node 0 at `master` (retrying until `timeout`, so the
/// nodes may start in any order), says hello and returns the id node 0 sends.
pub fn join(master: SocketAddr, node_rank: u32, job: &Job, timeout: Duration) -> Result<[u8; ID_BYTES], BootstrapError> {
    if node_rank == 0 || node_rank >= job.nnodes {
        return Err(BootstrapError::Config(format!("--node-rank {node_rank}: nodes other than node 0 are 1 to {}", job.nnodes.saturating_sub(1))));
    }
    let deadline = Instant::now() + timeout;
    let mut s = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&master, left.max(Duration::from_millis(50))) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(BootstrapError::Timeout(format!("node 0 at {master} did not answer within {timeout:?} ({e}): is node 0 running with --master-addr {master}?")));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
    s.set_read_timeout(Some(left)).map_err(io("setting up the connection"))?;
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&node_rank.to_le_bytes());
    hello.extend_from_slice(&job.nnodes.to_le_bytes());
    hello.extend_from_slice(&job.key.to_le_bytes());
    s.write_all(&hello).map_err(io(format!("saying hello to node 0 at {master}")))?;
    let waiting = |e: std::io::Error| {
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            BootstrapError::Timeout(format!("node 0 at {master} did not send the id within {timeout:?}: are all {} nodes started?", job.nnodes))
        } else {
            BootstrapError::Io { what: format!("reading node 0's answer from {master}"), cause: e }
        }
    };
    let mut status = [0u8; 1];
    s.read_exact(&mut status).map_err(waiting)?;
    match status[0] {
        0 => {
            let mut id = [0u8; ID_BYTES];
            s.read_exact(&mut id).map_err(waiting)?;
            Ok(id)
        }
        1 => {
            let mut len = [0u8; 4];
            s.read_exact(&mut len).map_err(waiting)?;
            let n = u32::from_le_bytes(len).min(MAX_REASON);
            let mut why = vec![0u8; n as usize];
            s.read_exact(&mut why).map_err(waiting)?;
            Err(BootstrapError::Refused(String::from_utf8_lossy(&why).into_owned()))
        }
        other => Err(BootstrapError::Refused(format!("node 0 at {master} answered {other}, not a kern bootstrap answer"))),
    }
}

/// One node's part: node 0 listens on `master`, makes the id with `make_id` and serves it;
/// every other node joins. Every node returns the same id. (`nnodes` = 1: just `make_id`.)
pub fn exchange<E: From<BootstrapError>>(
    master: SocketAddr,
    node_rank: u32,
    job: &Job,
    timeout: Duration,
    make_id: impl FnOnce() -> Result<[u8; ID_BYTES], E>,
) -> Result<[u8; ID_BYTES], E> {
    if node_rank == 0 {
        let listener = if job.nnodes > 1 { Some(Master::bind(master)?) } else { None };
        let id = make_id()?;
        if let Some(l) = listener {
            l.serve(job, &id, timeout)?;
        }
        Ok(id)
    } else {
        Ok(join(master, node_rank, job, timeout)?)
    }
}
