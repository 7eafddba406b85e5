//! Parse and serialise cost of the per-message frames: what a publish and a delivery cost the codec.

use bytes::{Bytes, BytesMut};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use warren_protocol::content::{encode_header, ContentHeader, Properties};
use warren_protocol::frame::{self, encode_body};
use warren_protocol::method::{encode_deliver, encode_publish, Method};
use warren_protocol::stream::{self, Command, PublishedMessage};

fn publish_bytes(n: usize, body: &[u8]) -> BytesMut {
    let props = Properties {
        delivery_mode: Some(2),
        ..Default::default()
    }
    .encode();
    let mut out = BytesMut::new();
    for _ in 0..n {
        encode_publish(&mut out, 1, b"amq.direct", b"perf-test-queue", false);
        encode_header(&mut out, 1, 60, body.len() as u64, &props);
        encode_body(&mut out, 1, body, 131_072);
    }
    out
}

fn codec(c: &mut Criterion) {
    let body = vec![0u8; 1024];
    let batch = 1000;
    let wire = publish_bytes(batch, &body).freeze();
    let mut g = c.benchmark_group("codec");
    g.throughput(Throughput::Elements(batch as u64));
    g.bench_function("parse_publish_1KB", |b| {
        b.iter(|| {
            let mut buf = BytesMut::from(&wire[..]);
            let mut n = 0;
            while let Some(f) = frame::decode(&mut buf, 131_072).unwrap() {
                match f.kind {
                    frame::FRAME_METHOD => {
                        black_box(Method::decode(f.payload).unwrap());
                    }
                    frame::FRAME_HEADER => {
                        let h = ContentHeader::decode(f.payload).unwrap();
                        black_box(Properties::decode(&h.properties).unwrap());
                    }
                    _ => n += f.payload.len(),
                }
            }
            black_box(n)
        })
    });
    let props = Properties {
        delivery_mode: Some(2),
        ..Default::default()
    }
    .encode();
    let body = Bytes::from(body);
    g.bench_function("serialise_deliver_1KB", |b| {
        let mut out = BytesMut::with_capacity(batch * 1200);
        b.iter(|| {
            out.clear();
            for tag in 0..batch as u64 {
                encode_deliver(
                    &mut out,
                    1,
                    b"amq.ctag-1",
                    tag,
                    false,
                    b"amq.direct",
                    b"perf-test-queue",
                );
                encode_header(&mut out, 1, 60, body.len() as u64, &props);
                encode_body(&mut out, 1, &body, 131_072);
            }
            black_box(out.len())
        })
    });
    g.finish();
}

/// The stream protocol's data plane: Publish frames of 100 messages (stream-perf-test's batch)
/// parsed into commands, messages sliced out of the buffer, as the server reads them.
fn stream_codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("stream_codec");
    for (name, size) in [("parse_publish_12B", 12), ("parse_publish_1KB", 1024)] {
        let message = Bytes::from(vec![7u8; size]);
        let frames = 10;
        let per_frame = 100;
        let mut wire = BytesMut::new();
        for f in 0..frames {
            stream::encode(
                &mut wire,
                &Command::Publish {
                    publisher_id: 1,
                    messages: (0..per_frame)
                        .map(|i| PublishedMessage {
                            sub_batch: None,
                            publishing_id: (f * per_frame + i) as u64,
                            filter_value: None,
                            message: message.clone(),
                        })
                        .collect(),
                },
            );
        }
        let wire = wire.freeze();
        g.throughput(Throughput::Elements((frames * per_frame) as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut buf = BytesMut::from(&wire[..]);
                let mut n = 0;
                while let Some(c) = stream::decode(&mut buf, 1_048_576).unwrap() {
                    if let Command::Publish { messages, .. } = c {
                        n += messages.len();
                    }
                }
                black_box(n)
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(std::time::Duration::from_secs(3)).sample_size(20);
    targets = codec, stream_codec
}
criterion_main!(benches);
