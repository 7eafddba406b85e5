//! The links between real transports on loopback sockets: frames a loop queues and flushes
//! itself (written through from its own thread while the link's task is idle) and frames left
//! to the link's task share one stream, so they must arrive whole and in the order sent, also
//! when a write only partly fits the socket.

mod common;

use raft::eraftpb::{Entry, Message};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use warren_cluster::frame::{self, Frame};
use warren_cluster::transport::{Callbacks, Inbound, RaftLinkSocket, Transport};

/// (group, entry bytes) of each Raft frame, in arrival order.
type Arrived = Arc<Mutex<Vec<(u64, usize)>>>;

async fn node(id: u64) -> (Transport, SocketAddr, Arrived) {
    let (t, addr, arrived, _) = node_taking_raft_links(id, false).await;
    (t, addr, arrived)
}

/// Raft links the node was handed (when it takes them at all).
type Taken = Arc<Mutex<Vec<RaftLinkSocket>>>;

async fn node_taking_raft_links(id: u64, takes: bool) -> (Transport, SocketAddr, Arrived, Taken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    node_on(id, takes, listener)
}

fn node_on(
    id: u64,
    takes: bool,
    listener: tokio::net::TcpListener,
) -> (Transport, SocketAddr, Arrived, Taken) {
    let addr = listener.local_addr().unwrap();
    let arrived: Arrived = Arc::default();
    let taken: Taken = Arc::default();
    let a = arrived.clone();
    let me = common::node_info(id, addr);
    let callbacks = Callbacks {
        inbound: Arc::new(move |inbound| {
            if let Inbound::Raft {
                group, messages, ..
            } = inbound
            {
                let bytes = messages[0].get_entries().iter().map(|e| e.data.len()).sum();
                a.lock().unwrap().push((group, bytes));
            }
        }),
        data: Arc::new(|_, _| Ok(())),
        link_up: Arc::new(|_, _| {}),
        link_broken: Arc::new(|_| {}),
        raft_link: takes.then(|| {
            let taken = taken.clone();
            Arc::new(move |link| taken.lock().unwrap().push(link)) as Arc<_>
        }),
    };
    (
        Transport::start(me, id * 1000, listener, callbacks),
        addr,
        arrived,
        taken,
    )
}

fn message(bytes: usize) -> Message {
    let entry = Entry {
        data: vec![7u8; bytes].into(),
        ..Default::default()
    };
    let mut m = Message::default();
    m.set_entries(vec![entry].into());
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_dials_us_is_dialled_back_at_once_not_after_the_pause_between_dials() {
    // Node 2's address, with nothing listening there yet: node 1's first dial is refused.
    let b_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (a, a_addr, _) = node(1).await;
    // A pause past the test's deadline: only a redial that skips it brings the link up.
    a.set_reconnect_delay(Duration::from_secs(3600));
    a.connect(2, b_addr.into());
    common::eventually("node 1's dial to be refused", || {
        a.links().iter().any(|l| l.peer == 2 && l.dials_failed > 0)
    })
    .await;
    let (b, _, _, _) = node_on(
        2,
        false,
        tokio::net::TcpListener::bind(b_addr).await.unwrap(),
    );
    b.connect(1, a_addr.into());
    common::eventually("node 1's link to node 2", || a.is_up(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_and_task_written_frames_arrive_whole_and_in_order() {
    let (a, _, _) = node(1).await;
    let (_b, b_addr, arrived) = node(2).await;
    a.connect(2, b_addr.into());
    for _ in 0..100 {
        if a.is_up(2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(a.is_up(2), "the link came up");
    // Small frames flushed one by one (written through), batches of them, frames left to the
    // task, and 1 MiB frames that cannot fit the socket in one write, interleaved.
    let mut sent = Vec::new();
    let sender = {
        let a = a.clone();
        std::thread::spawn(move || {
            for group in 1..=600u64 {
                let bytes = if group % 50 == 0 { 1 << 20 } else { 100 };
                let m = message(bytes);
                let queued = if group % 7 == 0 {
                    a.send_raft(2, group, &[m])
                } else {
                    a.queue_raft(2, group, &[m])
                };
                assert!(queued, "frame {group} refused");
                if group % 3 != 0 {
                    a.flush_queued();
                }
                sent.push((group, bytes));
            }
            a.flush_queued();
            sent
        })
    };
    let sent = tokio::task::spawn_blocking(move || sender.join().unwrap())
        .await
        .unwrap();
    for _ in 0..400 {
        if arrived.lock().unwrap().len() >= sent.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(*arrived.lock().unwrap(), sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_groups_frames_take_the_raft_link_once_it_is_up_and_its_taker_reads_them() {
    let (a, _, _, _) = node_taking_raft_links(1, true).await;
    let (_b, b_addr, arrived, taken) = node_taking_raft_links(2, true).await;
    a.connect(2, b_addr.into());
    common::eventually("the raft link came up", || {
        a.links().iter().any(|l| l.peer == 2 && l.raft_link)
    })
    .await;
    common::eventually("the peer took it", || taken.lock().unwrap().len() == 1).await;
    let link = taken.lock().unwrap().pop().unwrap();
    assert_eq!(link.from, 1);
    for group in [41, 42] {
        assert!(a.queue_raft(2, group, &[message(300)]));
    }
    a.flush_queued();
    let mut socket = link.socket;
    socket.set_nonblocking(false).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = link.buffered;
    let mut frames = Vec::new();
    while frames.len() < 2 {
        match frame::decode(&mut buf).unwrap() {
            Some(Frame::Raft { group, messages }) => frames.push((group, messages.len())),
            Some(other) => panic!("a raft link carried {other:?}"),
            None => {
                let mut chunk = [0u8; 4096];
                let n = std::io::Read::read(&mut socket, &mut chunk).unwrap();
                assert!(n > 0, "the raft link ended");
                buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
    assert_eq!(frames, vec![(41, 1), (42, 1)]);
    assert!(
        arrived
            .lock()
            .unwrap()
            .iter()
            .all(|(g, _)| *g != 41 && *g != 42),
        "none of them came by the main link"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_taker_at_the_dialling_end_no_raft_link_is_opened() {
    let (a, _, _, _) = node_taking_raft_links(1, false).await;
    let (_b, b_addr, arrived, taken) = node_taking_raft_links(2, true).await;
    a.connect(2, b_addr.into());
    common::eventually("the link came up", || a.is_up(2)).await;
    assert!(a.queue_raft(2, 43, &[message(10)]));
    a.flush_queued();
    common::eventually("the frame came by the main link", || {
        arrived.lock().unwrap().iter().any(|(g, _)| *g == 43)
    })
    .await;
    assert!(taken.lock().unwrap().is_empty());
    assert!(a.links().iter().all(|l| !l.raft_link));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_peer_is_never_dialled_again() {
    let nowhere = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (a, _, _) = node(1).await;
    a.forget(2);
    // Node 3, not forgotten, is dialled (and refused) at once: by then node 2 would have been.
    a.connect(2, nowhere().into());
    a.connect(3, nowhere().into());
    common::eventually("node 1's dial to node 3 to be refused", || {
        a.links().iter().any(|l| l.peer == 3 && l.dials_failed > 0)
    })
    .await;
    assert!(
        !a.links().iter().any(|l| l.peer == 2 && l.dials_failed > 0),
        "node 2 was dialled: {:?}",
        a.links()
    );
}
