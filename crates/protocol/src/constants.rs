//! Reply codes and class ids of AMQP 0-9-1, under the names RabbitMQ uses in reply texts.

pub const REPLY_SUCCESS: u16 = 200;
pub const CONTENT_TOO_LARGE: u16 = 311;
pub const NO_ROUTE: u16 = 312;
pub const NO_CONSUMERS: u16 = 313;
pub const CONNECTION_FORCED: u16 = 320;
pub const INVALID_PATH: u16 = 402;
pub const ACCESS_REFUSED: u16 = 403;
pub const NOT_FOUND: u16 = 404;
pub const RESOURCE_LOCKED: u16 = 405;
pub const PRECONDITION_FAILED: u16 = 406;
pub const FRAME_ERROR: u16 = 501;
pub const SYNTAX_ERROR: u16 = 502;
pub const COMMAND_INVALID: u16 = 503;
pub const CHANNEL_ERROR: u16 = 504;
pub const UNEXPECTED_FRAME: u16 = 505;
pub const RESOURCE_ERROR: u16 = 506;
pub const NOT_ALLOWED: u16 = 530;
pub const NOT_IMPLEMENTED: u16 = 540;
pub const INTERNAL_ERROR: u16 = 541;

/// The name RabbitMQ puts before the text of a close, e.g. `NOT_FOUND - no queue 'q'`.
pub fn reply_code_name(code: u16) -> &'static str {
    match code {
        REPLY_SUCCESS => "OK",
        CONTENT_TOO_LARGE => "CONTENT_TOO_LARGE",
        NO_ROUTE => "NO_ROUTE",
        NO_CONSUMERS => "NO_CONSUMERS",
        CONNECTION_FORCED => "CONNECTION_FORCED",
        INVALID_PATH => "INVALID_PATH",
        ACCESS_REFUSED => "ACCESS_REFUSED",
        NOT_FOUND => "NOT_FOUND",
        RESOURCE_LOCKED => "RESOURCE_LOCKED",
        PRECONDITION_FAILED => "PRECONDITION_FAILED",
        FRAME_ERROR => "FRAME_ERROR",
        SYNTAX_ERROR => "SYNTAX_ERROR",
        COMMAND_INVALID => "COMMAND_INVALID",
        CHANNEL_ERROR => "CHANNEL_ERROR",
        UNEXPECTED_FRAME => "UNEXPECTED_FRAME",
        RESOURCE_ERROR => "RESOURCE_ERROR",
        NOT_ALLOWED => "NOT_ALLOWED",
        NOT_IMPLEMENTED => "NOT_IMPLEMENTED",
        INTERNAL_ERROR => "INTERNAL_ERROR",
        _ => "UNKNOWN",
    }
}

/// Whether a reply code closes the whole connection (hard error) rather than one channel.
pub fn is_hard_error(code: u16) -> bool {
    matches!(
        code,
        CONNECTION_FORCED
            | INVALID_PATH
            | FRAME_ERROR
            | SYNTAX_ERROR
            | COMMAND_INVALID
            | CHANNEL_ERROR
            | UNEXPECTED_FRAME
            | RESOURCE_ERROR
            | NOT_ALLOWED
            | NOT_IMPLEMENTED
            | INTERNAL_ERROR
    )
}

pub const CLASS_CONNECTION: u16 = 10;
pub const CLASS_CHANNEL: u16 = 20;
pub const CLASS_ACCESS: u16 = 30;
pub const CLASS_EXCHANGE: u16 = 40;
pub const CLASS_QUEUE: u16 = 50;
pub const CLASS_BASIC: u16 = 60;
pub const CLASS_CONFIRM: u16 = 85;
pub const CLASS_TX: u16 = 90;
