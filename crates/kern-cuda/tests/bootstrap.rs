//! The multi-node bootstrap over 127.0.0.1: node 0 hands the NCCL unique id to every node, all
//! or nothing; wrong nodes are refused with the reason on both sides. No GPU, no NCCL.

use kern_cuda::bootstrap::{exchange, join, master_addr, BootstrapError, Job, Master, ID_BYTES};
use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

fn id() -> [u8; ID_BYTES] {
    std::array::from_fn(|i| (i * 7 + 3) as u8)
}

fn master() -> (Master, SocketAddr) {
    let m = Master::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let a = m.local_addr().unwrap();
    (m, a)
}

#[test]
fn every_node_gets_node_0_s_id() {
    let job = Job { nnodes: 4, key: 0xfeed };
    let (m, addr) = master();
    let peers: Vec<_> = (1..4).map(|r| thread::spawn(move || join(addr, r, &job, T))).collect();
    m.serve(&job, &id(), T).unwrap();
    for p in peers {
        assert_eq!(p.join().unwrap().unwrap(), id());
    }
}

#[test]
fn exchange_runs_both_sides_and_a_single_node_needs_no_network() {
    // Find a free port, then let node 1 start first: it retries until node 0 listens.
    let addr = master().1;
    let job = Job { nnodes: 2, key: 1 };
    let peer = thread::spawn(move || exchange::<BootstrapError>(addr, 1, &job, T, || panic!("only node 0 makes the id")));
    let got = exchange::<BootstrapError>(addr, 0, &job, T, || Ok(id())).unwrap();
    assert_eq!(got, id());
    assert_eq!(peer.join().unwrap().unwrap(), id());
    let alone = exchange::<BootstrapError>("127.0.0.1:1".parse().unwrap(), 0, &Job { nnodes: 1, key: 0 }, T, || Ok([9; ID_BYTES])).unwrap();
    assert_eq!(alone, [9; ID_BYTES]);
}

#[test]
fn a_node_of_another_job_is_refused_and_so_is_everyone() {
    let job = Job { nnodes: 3, key: 42 };
    let (m, addr) = master();
    let good = thread::spawn(move || join(addr, 1, &job, T));
    let other = thread::spawn(move || join(addr, 2, &Job { key: 43, ..job }, T));
    let err = m.serve(&job, &id(), T).unwrap_err().to_string();
    assert!(err.contains("node 2 from 127.0.0.1:") && err.contains("runs another job"), "{err}");
    let e1 = good.join().unwrap().unwrap_err().to_string();
    let e2 = other.join().unwrap().unwrap_err().to_string();
    assert!(e1.contains("refused by node 0") && e1.contains("runs another job"), "{e1}");
    assert!(e2.contains("refused by node 0") && e2.contains("key 000000000000002b, node 0's 000000000000002a"), "{e2}");
}

#[test]
fn duplicate_and_mismatched_nodes_are_refused() {
    let job = Job { nnodes: 3, key: 7 };
    let (m, addr) = master();
    let a = thread::spawn(move || join(addr, 1, &job, T));
    let b = thread::spawn(move || join(addr, 1, &job, T));
    let err = m.serve(&job, &id(), T).unwrap_err().to_string();
    assert!(err.contains("node rank 1 joined twice"), "{err}");
    for t in [a, b] {
        assert!(matches!(t.join().unwrap(), Err(BootstrapError::Refused(_))));
    }
    let (m, addr) = master();
    let c = thread::spawn(move || join(addr, 1, &Job { nnodes: 2, key: 7 }, T));
    let d = thread::spawn(move || join(addr, 2, &job, T));
    let err = m.serve(&job, &id(), T).unwrap_err().to_string();
    assert!(err.contains("was started with --nnodes 2, node 0 with 3"), "{err}");
    assert!(c.join().unwrap().is_err() && d.join().unwrap().is_err());
    // Ranks outside 1..nnodes are refused before connecting.
    let e = join(addr, 0, &job, T).unwrap_err().to_string();
    assert!(e.contains("--node-rank 0"), "{e}");
    assert!(join(addr, 3, &job, T).is_err());
}

#[test]
fn a_stray_connection_is_not_a_node() {
    use std::io::Write;
    let job = Job { nnodes: 2, key: 7 };
    let (m, addr) = master();
    let stray = thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    });
    let err = m.serve(&job, &id(), T).unwrap_err().to_string();
    assert!(err.contains("is not a kern node"), "{err}");
    stray.join().unwrap();
}

#[test]
fn nobody_listening_is_a_timeout_that_says_what_to_check() {
    let addr = master().1; // bound, then dropped: nothing listens there now
    let e = join(addr, 1, &Job { nnodes: 2, key: 0 }, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(e, BootstrapError::Timeout(_)), "{e}");
    assert!(e.to_string().contains("is node 0 running"), "{e}");
    // Node 0 alone: says which nodes never came.
    let (m, _) = master();
    let e = m.serve(&Job { nnodes: 3, key: 0 }, &id(), Duration::from_millis(200)).unwrap_err().to_string();
    assert!(e.contains("node(s) 1, 2 did not join"), "{e}");
}

#[test]
fn master_addresses_take_a_default_port() {
    assert_eq!(master_addr("127.0.0.1").unwrap(), "127.0.0.1:29500".parse().unwrap());
    assert_eq!(master_addr("127.0.0.1:1234").unwrap(), "127.0.0.1:1234".parse().unwrap());
    assert_eq!(master_addr("[::1]:5").unwrap(), "[::1]:5".parse().unwrap());
    assert_eq!(master_addr("localhost:7").unwrap().port(), 7);
    assert!(master_addr("no such host.invalid:1").is_err());
}
