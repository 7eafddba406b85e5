//! The AMQP error a command fails with: a reply code and text, sent as channel.close or
//! connection.close by the server depending on whether the code is a hard error.

use warren_protocol::constants::*;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpError {
    pub code: u16,
    /// The full reply text as RabbitMQ words it, e.g. `NOT_FOUND - no queue 'q' in vhost '/'`.
    pub text: String,
}

impl AmqpError {
    pub fn new(code: u16, detail: impl std::fmt::Display) -> Self {
        AmqpError {
            code,
            text: format!("{} - {}", reply_code_name(code), detail),
        }
    }

    /// An error whose reply text is already whole, as one received from another node.
    pub fn with_text(code: u16, text: String) -> Self {
        AmqpError { code, text }
    }

    pub fn not_found(detail: impl std::fmt::Display) -> Self {
        Self::new(NOT_FOUND, detail)
    }

    pub fn precondition(detail: impl std::fmt::Display) -> Self {
        Self::new(PRECONDITION_FAILED, detail)
    }

    pub fn access_refused(detail: impl std::fmt::Display) -> Self {
        Self::new(ACCESS_REFUSED, detail)
    }

    pub fn resource_locked(detail: impl std::fmt::Display) -> Self {
        Self::new(RESOURCE_LOCKED, detail)
    }

    pub fn command_invalid(detail: impl std::fmt::Display) -> Self {
        Self::new(COMMAND_INVALID, detail)
    }

    pub fn not_allowed(detail: impl std::fmt::Display) -> Self {
        Self::new(NOT_ALLOWED, detail)
    }

    pub fn not_implemented(detail: impl std::fmt::Display) -> Self {
        Self::new(NOT_IMPLEMENTED, detail)
    }

    pub fn is_hard(&self) -> bool {
        is_hard_error(self.code)
    }

    /// RabbitMQ's phrase for a queue, as it appears in reply texts.
    pub fn no_queue(name: &str, vhost: &str) -> Self {
        Self::not_found(format!("no queue '{name}' in vhost '{vhost}'"))
    }

    pub fn no_exchange(name: &str, vhost: &str) -> Self {
        Self::not_found(format!("no exchange '{name}' in vhost '{vhost}'"))
    }
}

impl std::fmt::Display for AmqpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.code, self.text)
    }
}

impl std::error::Error for AmqpError {}

pub type Result<T> = std::result::Result<T, AmqpError>;

/// Renders bytes as Erlang's `~p` prints a binary, the way RabbitMQ quotes frame contents in
/// its error texts: `<<"abc">>` when printable, `<<0,50,0,10>>` otherwise.
pub fn erlang_binary(b: &[u8]) -> String {
    let printable = !b.is_empty()
        && b.iter()
            .all(|c| (32..127).contains(c) || matches!(c, b'\n' | b'\r' | b'\t'));
    if printable {
        let mut s = String::from("<<\"");
        for &c in b {
            match c {
                b'"' => s.push_str("\\\""),
                b'\\' => s.push_str("\\\\"),
                b'\n' => s.push_str("\\n"),
                b'\r' => s.push_str("\\r"),
                b'\t' => s.push_str("\\t"),
                _ => s.push(c as char),
            }
        }
        s.push_str("\">>");
        return s;
    }
    let items: Vec<String> = b.iter().map(|c| c.to_string()).collect();
    format!("<<{}>>", items.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_print_as_erlang_does() {
        assert_eq!(erlang_binary(b"abc"), "<<\"abc\">>");
        assert_eq!(erlang_binary(&[0, 50, 0, 10]), "<<0,50,0,10>>");
        assert_eq!(erlang_binary(b""), "<<>>");
    }
}
