//! A stream protocol connection: the handshake (peer properties, SASL PLAIN, tune, open) and the
//! control-plane calls `warren perf stream` needs (create and delete a stream, declare a
//! publisher, subscribe), on `warren_protocol::stream`'s codec.
//!
//! The data plane (Publish out, PublishConfirm and Deliver in) belongs to
//! [`super::workload`], which reads and writes this connection's buffers itself so that it can
//! batch; [`encode_publish`] writes a whole Publish frame straight into the write buffer without
//! building a `Command` per message.

use anyhow::{anyhow, bail, Context, Result};
use bytes::{BufMut, BytesMut};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use warren_protocol::stream::constants::*;
use warren_protocol::stream::{self as sp, Command, OffsetSpec};

/// How long a handshake step or a control-plane call may take.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// The frame size we ask for (RabbitMQ offers 1 MiB); Deliver frames hold whole chunks.
pub const FRAME_MAX_REQUESTED: u32 = FRAME_MAX_DEFAULT_BYTES;
/// Free room kept in the read buffer before a read, so one read takes many frames.
pub const READ_BUF_BYTES: usize = 256 * 1024;
/// The largest frame a client accepts from the broker. RabbitMQ sends a Deliver with the whole
/// chunk even when the chunk is larger than the negotiated frame size (sub-entry batches make
/// chunks of several MB), so incoming frames are bounded by this, not by `frame_max`.
pub const READ_FRAME_BYTES_MAX: u32 = 64 * 1024 * 1024;
/// The stream protocol's default port (RabbitMQ's `stream.listeners.tcp`).
pub const STREAM_PORT_DEFAULT: u16 = 5552;

/// A `rabbitmq-stream://user:pass@host:port/vhost` URI, as the stream clients spell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamUri {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub vhost: String,
}

impl StreamUri {
    /// Parses the stream clients' URI form; user, password and vhost default to guest, guest
    /// and `/`, the port to 5552. The authority and path rules are the AMQP URI's.
    pub fn parse(s: &str) -> Result<StreamUri> {
        let rest = s.strip_prefix("rabbitmq-stream://").ok_or_else(|| {
            anyhow!("stream URI must start with rabbitmq-stream:// (TLS is not supported): {s}")
        })?;
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let has_port = rest[..authority_end]
            .rsplit_once('@')
            .map_or(&rest[..authority_end], |(_, h)| h)
            .contains(':');
        let amqp = if has_port {
            format!("amqp://{rest}")
        } else {
            format!(
                "amqp://{}:{STREAM_PORT_DEFAULT}{}",
                &rest[..authority_end],
                &rest[authority_end..]
            )
        };
        let u = crate::client::Uri::parse(&amqp).map_err(|e| anyhow!("{e} (in {s})"))?;
        Ok(StreamUri {
            host: u.host,
            port: u.port,
            user: u.user,
            password: u.password,
            vhost: u.vhost,
        })
    }
}

/// One stream protocol connection after its handshake.
pub struct StreamConnection {
    pub stream: TcpStream,
    pub rbuf: BytesMut,
    pub wbuf: BytesMut,
    /// Negotiated, size prefix included (0: no limit).
    pub frame_max: u32,
    pub heartbeat_s: u32,
    next_correlation_id: u32,
}

impl StreamConnection {
    /// Connects and runs the handshake; `name` is the `connection_name` peer property the
    /// broker shows in its listings.
    pub async fn open(uri: &StreamUri, name: &str) -> Result<StreamConnection> {
        let stream = tokio::time::timeout(
            RPC_TIMEOUT,
            TcpStream::connect((uri.host.as_str(), uri.port)),
        )
        .await
        .map_err(|_| anyhow!("timed out connecting to {}:{}", uri.host, uri.port))?
        .with_context(|| format!("cannot connect to {}:{}", uri.host, uri.port))?;
        stream.set_nodelay(true)?;
        let mut conn = StreamConnection {
            stream,
            rbuf: BytesMut::with_capacity(READ_BUF_BYTES),
            wbuf: BytesMut::with_capacity(64 * 1024),
            frame_max: FRAME_MAX_REQUESTED,
            heartbeat_s: 0,
            next_correlation_id: 1,
        };
        tokio::time::timeout(RPC_TIMEOUT, conn.handshake(uri, name))
            .await
            .map_err(|_| anyhow!("handshake with {}:{} timed out", uri.host, uri.port))??;
        Ok(conn)
    }

    async fn handshake(&mut self, uri: &StreamUri, name: &str) -> Result<()> {
        let properties = vec![
            ("product".to_string(), "warren perf".to_string()),
            ("connection_name".to_string(), name.to_string()),
        ];
        match self
            .call(|correlation_id| Command::PeerProperties {
                correlation_id,
                properties,
            })
            .await?
        {
            Command::PeerPropertiesResponse { code, .. } => check(code, "peer properties")?,
            other => bail!("unexpected answer to peer properties: {other:?}"),
        }
        match self
            .call(|correlation_id| Command::SaslHandshake { correlation_id })
            .await?
        {
            Command::SaslHandshakeResponse {
                code, mechanisms, ..
            } => {
                check(code, "SASL handshake")?;
                if !mechanisms.iter().any(|m| m == "PLAIN") {
                    bail!("the broker offers no SASL PLAIN (it offers {mechanisms:?})");
                }
            }
            other => bail!("unexpected answer to SASL handshake: {other:?}"),
        }
        let mut data = Vec::with_capacity(2 + uri.user.len() + uri.password.len());
        data.push(0);
        data.extend_from_slice(uri.user.as_bytes());
        data.push(0);
        data.extend_from_slice(uri.password.as_bytes());
        match self
            .call(|correlation_id| Command::SaslAuthenticate {
                correlation_id,
                mechanism: "PLAIN".into(),
                data: data.into(),
            })
            .await?
        {
            Command::SaslAuthenticateResponse { code, .. } => check(code, "authentication")
                .with_context(|| format!("logging in as {:?}", uri.user))?,
            other => bail!("unexpected answer to SASL authenticate: {other:?}"),
        }
        // The server proposes; the client answers with the smaller of each (0: no limit).
        let (frame_max, heartbeat_s) = loop {
            match self.next_command().await? {
                Command::Tune {
                    frame_max,
                    heartbeat_s,
                } => break (frame_max, heartbeat_s),
                Command::Heartbeat => continue,
                other => bail!("expected tune from the broker, got {other:?}"),
            }
        };
        self.frame_max = match frame_max {
            0 => FRAME_MAX_REQUESTED,
            f => f.min(FRAME_MAX_REQUESTED),
        };
        self.heartbeat_s = heartbeat_s;
        self.send(&Command::Tune {
            frame_max: self.frame_max,
            heartbeat_s,
        })
        .await?;
        let vhost = uri.vhost.clone();
        match self
            .call(|correlation_id| Command::Open {
                correlation_id,
                virtual_host: vhost,
            })
            .await?
        {
            Command::OpenResponse { code, .. } => {
                check(code, "open").with_context(|| format!("opening vhost {:?}", uri.vhost))
            }
            other => bail!("unexpected answer to open: {other:?}"),
        }
    }

    pub async fn flush(&mut self) -> Result<()> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        Ok(())
    }

    pub async fn send(&mut self, command: &Command) -> Result<()> {
        sp::encode(&mut self.wbuf, command);
        self.flush().await
    }

    /// Reads once into the read buffer without waiting; `Ok(false)` when nothing is there.
    pub fn try_fill(&mut self) -> Result<bool> {
        self.reserve_read_room();
        match self.stream.try_read_buf(&mut self.rbuf) {
            Ok(0) => bail!("the broker closed the connection"),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn fill(&mut self) -> Result<()> {
        self.reserve_read_room();
        loop {
            self.stream.readable().await?;
            if self.try_fill()? {
                return Ok(());
            }
        }
    }

    fn reserve_read_room(&mut self) {
        if self.rbuf.capacity() - self.rbuf.len() < READ_BUF_BYTES / 4 {
            self.rbuf.reserve(READ_BUF_BYTES);
        }
    }

    /// The next whole command in the read buffer, if there is one.
    pub fn decode_next(&mut self) -> Result<Option<Command>> {
        sp::decode(&mut self.rbuf, READ_FRAME_BYTES_MAX).map_err(|e| {
            anyhow!(
                "bad frame from the broker: {e} ({})",
                response_code_name(e.response_code())
            )
        })
    }

    /// Waits for the next command; a Close from the broker becomes an error with its reason.
    pub async fn next_command(&mut self) -> Result<Command> {
        loop {
            if let Some(c) = self.decode_next()? {
                if let Command::Close { code, reason, .. } = &c {
                    bail!(
                        "the broker closed the connection: {} ({reason})",
                        response_code_name(*code)
                    );
                }
                return Ok(c);
            }
            self.fill().await?;
        }
    }

    /// Sends a request and waits for the response with its correlation id, answering
    /// heartbeats and skipping one-way commands on the way.
    pub async fn call(&mut self, request: impl FnOnce(u32) -> Command) -> Result<Command> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1).max(1);
        let request = request(correlation_id);
        self.send(&request).await?;
        tokio::time::timeout(RPC_TIMEOUT, async {
            loop {
                let c = self.next_command().await?;
                if c == Command::Heartbeat {
                    self.send(&Command::Heartbeat).await?;
                    continue;
                }
                if c.correlation_id() == Some(correlation_id) && c.wire_key() & RESPONSE_BIT != 0 {
                    return Ok(c);
                }
            }
        })
        .await
        .map_err(|_| anyhow!("no answer to {request:?} within {RPC_TIMEOUT:?}"))?
    }

    async fn call_for_code(&mut self, request: impl FnOnce(u32) -> Command) -> Result<u16> {
        match self.call(request).await? {
            Command::Response { code, .. } => Ok(code),
            other => bail!("unexpected answer: {other:?}"),
        }
    }

    /// Creates `stream`; `Ok(false)` when it exists already (as stream-perf-test, which goes on
    /// with the existing stream).
    pub async fn create_stream(
        &mut self,
        stream: &str,
        arguments: &[(String, String)],
    ) -> Result<bool> {
        let code = self
            .call_for_code(|correlation_id| Command::Create {
                correlation_id,
                stream: stream.to_string(),
                arguments: arguments.to_vec(),
            })
            .await?;
        match code {
            RESPONSE_CODE_OK => Ok(true),
            RESPONSE_CODE_STREAM_ALREADY_EXISTS => Ok(false),
            c => Err(code_error(c)).with_context(|| format!("creating stream {stream:?}")),
        }
    }

    pub async fn delete_stream(&mut self, stream: &str) -> Result<()> {
        let code = self
            .call_for_code(|correlation_id| Command::Delete {
                correlation_id,
                stream: stream.to_string(),
            })
            .await?;
        check(code, "delete").with_context(|| format!("deleting stream {stream:?}"))
    }

    pub async fn declare_publisher(&mut self, publisher_id: u8, stream: &str) -> Result<()> {
        let code = self
            .call_for_code(|correlation_id| Command::DeclarePublisher {
                correlation_id,
                publisher_id,
                reference: String::new(),
                stream: stream.to_string(),
            })
            .await?;
        check(code, "declare publisher")
            .with_context(|| format!("declaring a publisher on stream {stream:?}"))
    }

    pub async fn subscribe(
        &mut self,
        subscription_id: u8,
        stream: &str,
        offset: OffsetSpec,
        credit: u16,
    ) -> Result<()> {
        let code = self
            .call_for_code(|correlation_id| Command::Subscribe {
                correlation_id,
                subscription_id,
                stream: stream.to_string(),
                offset,
                credit,
                properties: Vec::new(),
            })
            .await?;
        check(code, "subscribe").with_context(|| format!("subscribing to stream {stream:?}"))
    }

    /// Closes politely; errors are ignored because the run's results are already taken.
    pub async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            self.call(|correlation_id| Command::Close {
                correlation_id,
                code: RESPONSE_CODE_OK,
                reason: "OK".into(),
            })
            .await
        })
        .await;
    }
}

fn code_error(code: u16) -> anyhow::Error {
    anyhow!(
        "the broker answered {} (0x{code:02x})",
        response_code_name(code)
    )
}

fn check(code: u16, what: &str) -> Result<()> {
    if code == RESPONSE_CODE_OK {
        Ok(())
    } else {
        Err(code_error(code)).with_context(|| what.to_string())
    }
}

/// Bytes of one Publish frame before its messages: size, key, version, publisher id, count.
pub const PUBLISH_HEADER_BYTES: usize = 4 + 2 + 2 + 1 + 4;

/// Appends one Publish frame (version 1) of `count` entries, each from `entry`, which writes
/// the entry's bytes after its publishing id. This is the same frame `frame::encode` writes for
/// `Command::Publish`, without a `Vec` of messages per batch; with sub-entries an entry is a
/// sub-batch (PROTOCOL.adoc's "SubEntry"), which the codec's `PublishedMessage` cannot hold.
pub fn encode_publish(
    out: &mut BytesMut,
    publisher_id: u8,
    first_publishing_id: u64,
    count: u32,
    mut entry: impl FnMut(&mut BytesMut, u32),
) {
    let start = out.len();
    out.put_u32(0);
    out.put_u16(KEY_PUBLISH);
    out.put_u16(VERSION_1);
    out.put_u8(publisher_id);
    out.put_u32(count);
    for i in 0..count {
        out.put_u64(first_publishing_id + i as u64);
        entry(out, i);
    }
    let size = out.len() - start - FRAME_SIZE_PREFIX_BYTES;
    assert!(size <= u32::MAX as usize, "publish frame over 4 GiB");
    out[start..start + 4].copy_from_slice(&(size as u32).to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use warren_protocol::stream::PublishedMessage;

    #[test]
    fn stream_uris_take_the_stream_port_and_the_amqp_rules() {
        let u = StreamUri::parse("rabbitmq-stream://localhost").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("localhost", 5552));
        assert_eq!((u.user.as_str(), u.vhost.as_str()), ("guest", "/"));
        let u = StreamUri::parse("rabbitmq-stream://a:b%40c@127.0.0.1:5560/v%2fh").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("127.0.0.1", 5560));
        assert_eq!((u.user.as_str(), u.password.as_str()), ("a", "b@c"));
        assert_eq!(u.vhost, "v/h");
        let u = StreamUri::parse("rabbitmq-stream://u:p@h/vh").unwrap();
        assert_eq!((u.port, u.vhost.as_str()), (5552, "vh"));
        assert!(StreamUri::parse("amqp://localhost").is_err());
        assert!(StreamUri::parse("rabbitmq-stream://h:notaport").is_err());
    }

    /// The hand-written Publish frame is the codec's frame, byte for byte, and decodes back.
    #[test]
    fn encode_publish_writes_the_codecs_publish_frame() {
        let bodies: Vec<Bytes> = (0..3u8)
            .map(|i| Bytes::from(vec![i; 5 + i as usize]))
            .collect();
        let mut ours = BytesMut::new();
        encode_publish(&mut ours, 7, 41, 3, |out, i| {
            out.put_u32(bodies[i as usize].len() as u32);
            out.put_slice(&bodies[i as usize]);
        });
        let command = Command::Publish {
            publisher_id: 7,
            messages: (0..3)
                .map(|i| PublishedMessage {
                    publishing_id: 41 + i as u64,
                    filter_value: None,
                    message: bodies[i].clone(),
                })
                .collect(),
        };
        let mut codec = BytesMut::new();
        sp::encode(&mut codec, &command);
        assert_eq!(ours, codec);
        assert_eq!(sp::decode(&mut ours, 0).unwrap(), Some(command));
        assert!(ours.is_empty());
    }
}
