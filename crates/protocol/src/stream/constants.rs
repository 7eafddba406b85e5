//! Command keys, response codes, offset types and limits of the stream protocol, under the names
//! PROTOCOL.adoc gives them.

/// Set on the key of a response; the other 15 bits are the command's key.
pub const RESPONSE_BIT: u16 = 0x8000;

pub const KEY_DECLARE_PUBLISHER: u16 = 0x0001;
pub const KEY_PUBLISH: u16 = 0x0002;
pub const KEY_PUBLISH_CONFIRM: u16 = 0x0003;
pub const KEY_PUBLISH_ERROR: u16 = 0x0004;
pub const KEY_QUERY_PUBLISHER_SEQUENCE: u16 = 0x0005;
pub const KEY_DELETE_PUBLISHER: u16 = 0x0006;
pub const KEY_SUBSCRIBE: u16 = 0x0007;
pub const KEY_DELIVER: u16 = 0x0008;
pub const KEY_CREDIT: u16 = 0x0009;
pub const KEY_STORE_OFFSET: u16 = 0x000a;
pub const KEY_QUERY_OFFSET: u16 = 0x000b;
pub const KEY_UNSUBSCRIBE: u16 = 0x000c;
pub const KEY_CREATE: u16 = 0x000d;
pub const KEY_DELETE: u16 = 0x000e;
pub const KEY_METADATA: u16 = 0x000f;
pub const KEY_METADATA_UPDATE: u16 = 0x0010;
pub const KEY_PEER_PROPERTIES: u16 = 0x0011;
pub const KEY_SASL_HANDSHAKE: u16 = 0x0012;
pub const KEY_SASL_AUTHENTICATE: u16 = 0x0013;
pub const KEY_TUNE: u16 = 0x0014;
pub const KEY_OPEN: u16 = 0x0015;
pub const KEY_CLOSE: u16 = 0x0016;
pub const KEY_HEARTBEAT: u16 = 0x0017;
pub const KEY_ROUTE: u16 = 0x0018;
pub const KEY_PARTITIONS: u16 = 0x0019;
/// 3.11: single active consumer.
pub const KEY_CONSUMER_UPDATE: u16 = 0x001a;
/// 3.11: lets client and server agree on Publish v2 and Deliver v2.
pub const KEY_EXCHANGE_COMMAND_VERSIONS: u16 = 0x001b;
pub const KEY_STREAM_STATS: u16 = 0x001c;
/// 3.13.
pub const KEY_CREATE_SUPER_STREAM: u16 = 0x001d;
/// 3.13.
pub const KEY_DELETE_SUPER_STREAM: u16 = 0x001e;

pub const RESPONSE_CODE_OK: u16 = 0x01;
pub const RESPONSE_CODE_STREAM_DOES_NOT_EXIST: u16 = 0x02;
pub const RESPONSE_CODE_SUBSCRIPTION_ID_ALREADY_EXISTS: u16 = 0x03;
pub const RESPONSE_CODE_SUBSCRIPTION_ID_DOES_NOT_EXIST: u16 = 0x04;
pub const RESPONSE_CODE_STREAM_ALREADY_EXISTS: u16 = 0x05;
pub const RESPONSE_CODE_STREAM_NOT_AVAILABLE: u16 = 0x06;
pub const RESPONSE_CODE_SASL_MECHANISM_NOT_SUPPORTED: u16 = 0x07;
pub const RESPONSE_CODE_AUTHENTICATION_FAILURE: u16 = 0x08;
pub const RESPONSE_CODE_SASL_ERROR: u16 = 0x09;
pub const RESPONSE_CODE_SASL_CHALLENGE: u16 = 0x0a;
pub const RESPONSE_CODE_SASL_AUTHENTICATION_FAILURE_LOOPBACK: u16 = 0x0b;
pub const RESPONSE_CODE_VIRTUAL_HOST_ACCESS_FAILURE: u16 = 0x0c;
pub const RESPONSE_CODE_UNKNOWN_FRAME: u16 = 0x0d;
pub const RESPONSE_CODE_FRAME_TOO_LARGE: u16 = 0x0e;
pub const RESPONSE_CODE_INTERNAL_ERROR: u16 = 0x0f;
pub const RESPONSE_CODE_ACCESS_REFUSED: u16 = 0x10;
pub const RESPONSE_CODE_PRECONDITION_FAILED: u16 = 0x11;
pub const RESPONSE_CODE_PUBLISHER_DOES_NOT_EXIST: u16 = 0x12;
/// 3.11: QueryOffset for a reference that never stored one.
pub const RESPONSE_CODE_NO_OFFSET: u16 = 0x13;

/// The name of a response code as PROTOCOL.adoc's table gives it, for logs and close reasons.
pub fn response_code_name(code: u16) -> &'static str {
    match code {
        RESPONSE_CODE_OK => "ok",
        RESPONSE_CODE_STREAM_DOES_NOT_EXIST => "stream does not exist",
        RESPONSE_CODE_SUBSCRIPTION_ID_ALREADY_EXISTS => "subscription ID already exists",
        RESPONSE_CODE_SUBSCRIPTION_ID_DOES_NOT_EXIST => "subscription ID does not exist",
        RESPONSE_CODE_STREAM_ALREADY_EXISTS => "stream already exists",
        RESPONSE_CODE_STREAM_NOT_AVAILABLE => "stream not available",
        RESPONSE_CODE_SASL_MECHANISM_NOT_SUPPORTED => "SASL mechanism not supported",
        RESPONSE_CODE_AUTHENTICATION_FAILURE => "authentication failure",
        RESPONSE_CODE_SASL_ERROR => "SASL error",
        RESPONSE_CODE_SASL_CHALLENGE => "SASL challenge",
        RESPONSE_CODE_SASL_AUTHENTICATION_FAILURE_LOOPBACK => {
            "SASL authentication failure loopback"
        }
        RESPONSE_CODE_VIRTUAL_HOST_ACCESS_FAILURE => "virtual host access failure",
        RESPONSE_CODE_UNKNOWN_FRAME => "unknown frame",
        RESPONSE_CODE_FRAME_TOO_LARGE => "frame too large",
        RESPONSE_CODE_INTERNAL_ERROR => "internal error",
        RESPONSE_CODE_ACCESS_REFUSED => "access refused",
        RESPONSE_CODE_PRECONDITION_FAILED => "precondition failed",
        RESPONSE_CODE_PUBLISHER_DOES_NOT_EXIST => "publisher does not exist",
        RESPONSE_CODE_NO_OFFSET => "no offset",
        _ => "unknown response code",
    }
}

pub const OFFSET_TYPE_NONE: u16 = 0;
pub const OFFSET_TYPE_FIRST: u16 = 1;
pub const OFFSET_TYPE_LAST: u16 = 2;
pub const OFFSET_TYPE_NEXT: u16 = 3;
pub const OFFSET_TYPE_OFFSET: u16 = 4;
pub const OFFSET_TYPE_TIMESTAMP: u16 = 5;

pub const VERSION_1: u16 = 1;
/// Publish with a filter value per message, Deliver with the committed chunk id (3.13).
pub const VERSION_2: u16 = 2;

/// The highest version of a command this codec reads and writes; `None` for a key it does not
/// know. A client learns these through ExchangeCommandVersions before it uses a version 2.
pub fn version_max(key: u16) -> Option<u16> {
    match key {
        KEY_PUBLISH | KEY_DELIVER => Some(VERSION_2),
        KEY_DECLARE_PUBLISHER..=KEY_DELETE_SUPER_STREAM => Some(VERSION_1),
        _ => None,
    }
}

/// Key (2) and version (2): the smallest frame after its size prefix.
pub const FRAME_HEADER_BYTES: usize = 4;
/// The uint32 size that starts every frame and does not count itself.
pub const FRAME_SIZE_PREFIX_BYTES: usize = 4;
/// RabbitMQ's default `stream.frame_max`, offered in Tune: 1 MiB, size prefix included.
pub const FRAME_MAX_DEFAULT_BYTES: u32 = 1_048_576;
/// A publisher or writer reference longer than this is refused (PROTOCOL.adoc: "max 256").
pub const REFERENCE_BYTES_MAX: usize = 256;
