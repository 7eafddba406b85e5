//! The links between real transports on loopback sockets: frames a loop queues and flushes
//! itself (written through from its own thread while the link's task is idle) and frames left
//! to the link's task share one stream, so they must arrive whole and in the order sent, also
//! when a write only partly fits the socket.

mod common;

use raft::eraftpb::{Entry, Message};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use warren_cluster::transport::{Callbacks, Inbound, Transport};

/// (group, entry bytes) of each Raft frame, in arrival order.
type Arrived = Arc<Mutex<Vec<(u64, usize)>>>;

async fn node(id: u64) -> (Transport, SocketAddr, Arrived) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let arrived: Arrived = Arc::default();
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
    };
    (
        Transport::start(me, id * 1000, listener, callbacks),
        addr,
        arrived,
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
async fn flushed_and_task_written_frames_arrive_whole_and_in_order() {
    let (a, _, _) = node(1).await;
    let (_b, b_addr, arrived) = node(2).await;
    a.connect(2, b_addr);
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
