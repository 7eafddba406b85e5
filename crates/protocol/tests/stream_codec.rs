//! The stream codec against itself and against hand-built bytes: every command round-trips,
//! frames arrive in any split, and what is not a frame becomes the protocol's error code.

mod stream_support;

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use stream_support::{command, Text};
use warren_protocol::stream::constants::*;
use warren_protocol::stream::{self, Command, DecodeError};

fn encoded(command: &Command) -> BytesMut {
    let mut out = BytesMut::new();
    stream::encode(&mut out, command);
    out
}

/// A frame as raw parts: what a misbehaving client could send.
fn raw_frame(key: u16, version: u16, body: &[u8]) -> BytesMut {
    let mut out = BytesMut::new();
    out.put_u32((4 + body.len()) as u32);
    out.put_u16(key);
    out.put_u16(version);
    out.put_slice(body);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn every_command_round_trips(c in command(Text { allow_empty: true })) {
        let mut buf = encoded(&c);
        let got = stream::decode(&mut buf, 0).unwrap();
        prop_assert_eq!(got, Some(c));
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn frames_split_anywhere_decode_to_the_same_commands(
        commands in proptest::collection::vec(command(Text { allow_empty: true }), 1..6),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let mut wire = BytesMut::new();
        for c in &commands {
            stream::encode(&mut wire, c);
        }
        let mut cut_at: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
        cut_at.push(wire.len());
        cut_at.sort_unstable();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut from = 0;
        for to in cut_at {
            buf.put_slice(&wire[from..to]);
            from = to;
            while let Some(c) = stream::decode(&mut buf, 0).unwrap() {
                got.push(c);
            }
        }
        prop_assert_eq!(got, commands);
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn deliver_header_then_chunk_is_the_whole_deliver(
        subscription_id in any::<u8>(),
        committed_offset in proptest::option::of(any::<u64>()),
        chunk in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut split = BytesMut::new();
        stream::encode_deliver_header(&mut split, subscription_id, committed_offset, chunk.len());
        split.put_slice(&chunk);
        let whole = encoded(&Command::Deliver { subscription_id, committed_offset, chunk: Bytes::from(chunk) });
        prop_assert_eq!(split, whole);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_never_loop(input in proptest::collection::vec(any::<u8>(), 0..600), frame_max in prop_oneof![Just(0u32), Just(64), Just(FRAME_MAX_DEFAULT_BYTES)]) {
        let mut buf = BytesMut::from(&input[..]);
        loop {
            let before = buf.len();
            match stream::decode(&mut buf, frame_max) {
                Ok(Some(c)) => {
                    // What decodes re-encodes to a frame that decodes to the same command.
                    let mut again = encoded(&c);
                    prop_assert_eq!(stream::decode(&mut again, 0).unwrap(), Some(c));
                }
                Ok(None) | Err(DecodeError::FrameTooLarge { .. }) => break,
                Err(_) => {}
            }
            prop_assert!(buf.len() < before, "decode made no progress");
        }
    }

    #[test]
    fn a_known_command_with_random_body_is_a_command_or_unknown_frame(
        key in 1u16..=0x1e, response in any::<bool>(), version in 0u16..4,
        body in proptest::collection::vec(any::<u8>(), 0..80),
    ) {
        let key = if response { key | RESPONSE_BIT } else { key };
        let mut buf = raw_frame(key, version, &body);
        match stream::decode(&mut buf, 0) {
            Ok(c) => prop_assert!(c.is_some()),
            Err(e) => prop_assert_eq!(e.response_code(), RESPONSE_CODE_UNKNOWN_FRAME),
        }
        prop_assert!(buf.is_empty(), "a frame of known size is always consumed");
    }
}

#[test]
fn a_frame_over_frame_max_is_refused_from_its_size_alone() {
    // Only the size prefix has arrived: 1 MiB + 1 with the prefix.
    let mut buf = BytesMut::new();
    buf.put_u32(FRAME_MAX_DEFAULT_BYTES - 4 + 1);
    let err = stream::decode(&mut buf, FRAME_MAX_DEFAULT_BYTES).unwrap_err();
    assert_eq!(
        err,
        DecodeError::FrameTooLarge {
            size: FRAME_MAX_DEFAULT_BYTES - 3,
            max: FRAME_MAX_DEFAULT_BYTES
        }
    );
    assert_eq!(err.response_code(), RESPONSE_CODE_FRAME_TOO_LARGE);
    // Exactly frame_max, prefix included, is allowed: more bytes are simply awaited.
    let mut buf = BytesMut::new();
    buf.put_u32(FRAME_MAX_DEFAULT_BYTES - 4);
    assert_eq!(stream::decode(&mut buf, FRAME_MAX_DEFAULT_BYTES), Ok(None));
}

#[test]
fn an_unknown_key_is_unknown_frame_and_is_skipped() {
    let mut buf = raw_frame(0x0077, 1, b"whatever");
    buf.unsplit(encoded(&Command::Heartbeat));
    let err = stream::decode(&mut buf, 0).unwrap_err();
    assert_eq!(
        err,
        DecodeError::UnknownCommand {
            key: 0x0077,
            version: 1
        }
    );
    assert_eq!(err.response_code(), RESPONSE_CODE_UNKNOWN_FRAME);
    assert_eq!(stream::decode(&mut buf, 0), Ok(Some(Command::Heartbeat)));
}

#[test]
fn a_response_to_a_one_way_command_is_unknown() {
    // Deliver has no response.
    let mut buf = raw_frame(KEY_DELIVER | RESPONSE_BIT, 1, &[0, 0, 0, 1, 0, 1]);
    assert!(matches!(
        stream::decode(&mut buf, 0),
        Err(DecodeError::UnknownCommand { key: 0x8008, .. })
    ));
}

#[test]
fn versions_beyond_what_a_command_has_are_refused() {
    let mut buf = raw_frame(KEY_HEARTBEAT, 2, &[]);
    assert_eq!(
        stream::decode(&mut buf, 0),
        Err(DecodeError::UnsupportedVersion {
            key: KEY_HEARTBEAT,
            version: 2
        })
    );
    let mut buf = raw_frame(KEY_PUBLISH, 3, &[0, 0, 0, 0, 0]);
    assert!(matches!(
        stream::decode(&mut buf, 0),
        Err(DecodeError::UnsupportedVersion { version: 3, .. })
    ));
}

#[test]
fn a_frame_too_short_for_key_and_version_is_refused_and_skipped() {
    let mut buf = BytesMut::from(&[0u8, 0, 0, 2, 0, 0x17][..]);
    buf.unsplit(encoded(&Command::Heartbeat));
    assert_eq!(
        stream::decode(&mut buf, 0),
        Err(DecodeError::TooShort { size: 2 })
    );
    assert_eq!(stream::decode(&mut buf, 0), Ok(Some(Command::Heartbeat)));
}

#[test]
fn trailing_bytes_after_the_last_field_are_a_bad_frame() {
    let mut buf = raw_frame(KEY_HEARTBEAT, 1, &[0]);
    assert!(matches!(
        stream::decode(&mut buf, 0),
        Err(DecodeError::BadBody {
            why: stream::wire::BodyError::TrailingBytes,
            ..
        })
    ));
}

#[test]
fn a_count_larger_than_the_frame_is_refused_before_allocating() {
    // PublishConfirm claiming 2^31 ids in a 9-byte body.
    let mut buf = raw_frame(
        KEY_PUBLISH_CONFIRM,
        1,
        &[7, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0],
    );
    assert!(matches!(
        stream::decode(&mut buf, 0),
        Err(DecodeError::BadBody {
            why: stream::wire::BodyError::BadLength,
            ..
        })
    ));
}

#[test]
fn rabbitmq_style_omissions_decode() {
    // Subscribe without a properties count (RabbitMQ's own encoder leaves an empty map out).
    let mut body = BytesMut::new();
    body.put_u32(9);
    body.put_u8(3);
    body.put_u16(1);
    body.put_slice(b"s");
    body.put_u16(OFFSET_TYPE_NEXT);
    body.put_u16(10);
    let mut buf = raw_frame(KEY_SUBSCRIBE, 1, &body);
    assert_eq!(
        stream::decode(&mut buf, 0),
        Ok(Some(Command::Subscribe {
            correlation_id: 9,
            subscription_id: 3,
            stream: "s".into(),
            offset: stream::OffsetSpec::Next,
            credit: 10,
            properties: vec![],
        }))
    );
    // An Open response with an error code and nothing after it.
    let mut buf = raw_frame(KEY_OPEN | RESPONSE_BIT, 1, &[0, 0, 0, 5, 0, 0x0c]);
    assert_eq!(
        stream::decode(&mut buf, 0),
        Ok(Some(Command::OpenResponse {
            correlation_id: 5,
            code: RESPONSE_CODE_VIRTUAL_HOST_ACCESS_FAILURE,
            properties: vec![],
        }))
    );
    // A Tune answered with the response bit set (some clients do).
    let mut buf = raw_frame(KEY_TUNE | RESPONSE_BIT, 1, &[0, 1, 0, 0, 0, 0, 0, 60]);
    assert_eq!(
        stream::decode(&mut buf, 0),
        Ok(Some(Command::Tune {
            frame_max: 65536,
            heartbeat_s: 60
        }))
    );
    // Null strings (-1) and null bytes read as empty.
    let mut body = BytesMut::new();
    body.put_u32(1);
    body.put_i16(-1);
    body.put_i32(-1);
    let mut buf = raw_frame(KEY_SASL_AUTHENTICATE, 1, &body);
    assert_eq!(
        stream::decode(&mut buf, 0),
        Ok(Some(Command::SaslAuthenticate {
            correlation_id: 1,
            mechanism: String::new(),
            data: Bytes::new(),
        }))
    );
}

#[test]
fn publish_version_follows_the_filter_values() {
    let message = |filter_value: Option<&str>| stream::PublishedMessage {
        sub_batch: None,
        publishing_id: 1,
        filter_value: filter_value.map(str::to_owned),
        message: Bytes::from_static(b"m"),
    };
    let plain = Command::Publish {
        publisher_id: 0,
        messages: vec![message(None)],
    };
    assert_eq!(plain.version(), VERSION_1);
    let filtered = Command::Publish {
        publisher_id: 0,
        messages: vec![message(None), message(Some("eu"))],
    };
    assert_eq!(filtered.version(), VERSION_2);
    // In a version 2 frame a message without a filter value carries -1.
    let wire = encoded(&filtered);
    assert_eq!(&wire[4..8], &[0, 2, 0, 2]);
    assert_eq!(&wire[9 + 4 + 8..9 + 4 + 10], &[0xff, 0xff]);
}

/// The fuzzer's seeds (`fuzz/corpus/stream_frame`) are whole conversations a client could send:
/// each decodes to the end without an error, so fuzzing starts from real frames.
#[test]
fn the_fuzz_seeds_decode_whole() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/stream_frame");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let mut buf = BytesMut::from(&std::fs::read(&path).unwrap()[..]);
        let mut commands = 0;
        while let Some(c) = stream::decode(&mut buf, FRAME_MAX_DEFAULT_BYTES)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        {
            let _ = c;
            commands += 1;
        }
        assert!(buf.is_empty() && commands > 0, "{}", path.display());
        seeds += 1;
    }
    assert!(seeds >= 5);
}

/// Found by the `stream_frame` fuzzer: an Open response with an error code and properties
/// decoded with them and re-encoded without (the encoder wrote the map only with OK).
#[test]
fn an_open_response_with_an_error_code_and_properties_round_trips() {
    let crash: &[u8] = &[
        0x00, 0x00, 0x00, 0x14, 0x80, 0x15, 0x00, 0x01, 0x08, 0x86, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00,
    ];
    let mut buf = BytesMut::from(crash);
    let c = stream::decode(&mut buf, 0).unwrap().unwrap();
    assert_eq!(
        c,
        Command::OpenResponse {
            correlation_id: 0x0886_0000,
            code: 0,
            properties: vec![("\0\0".into(), String::new())],
        }
    );
    assert_eq!(&encoded(&c)[..], crash);
}
