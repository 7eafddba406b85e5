//! A minimal AMQP 0-9-1 client, enough to drive any broker the way PerfTest does.
//!
//! - `wire`: frame and method encoding/decoding into caller-owned buffers.
//! - [`Connection`]: TCP connect, the PLAIN handshake, and blocking-style control-plane calls
//!   (declare, bind, qos, consume). The data plane (publish, deliver, ack, confirms) lives in
//!   `workload`, which takes the connection's socket and buffers and batches frames itself.

pub mod wire;

use anyhow::{anyhow, bail, Context, Result};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wire::{method, CloseReason, FieldValue, Frame, QueueDeclare, FRAME_METHOD};

/// How long a handshake or control-plane call may take before we call the broker unresponsive.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// Read buffer size: large enough to take many deliveries per read syscall.
pub const READ_BUF_BYTES: usize = 256 * 1024;
/// The frame size we ask for; RabbitMQ proposes 128 KiB and we take the smaller of the two.
pub const FRAME_MAX_REQUESTED: u32 = 128 * 1024;

/// An `amqp://user:pass@host:port/vhost` URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uri {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub vhost: String,
}

fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .ok_or_else(|| anyhow!("bad percent escape in {s:?}"))?;
            out.push(
                u8::from_str_radix(hex, 16).map_err(|_| anyhow!("bad percent escape in {s:?}"))?,
            );
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| anyhow!("URI part is not UTF-8: {s:?}"))
}

impl Uri {
    pub fn parse(s: &str) -> Result<Uri> {
        let rest = s
            .strip_prefix("amqp://")
            .ok_or_else(|| anyhow!("URI must start with amqp:// (amqps is not supported): {s}"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => (rest, None),
        };
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            Some(ui) => match ui.split_once(':') {
                Some((u, p)) => (percent_decode(u)?, percent_decode(p)?),
                None => (percent_decode(ui)?, String::new()),
            },
            None => ("guest".to_string(), "guest".to_string()),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() => (
                h.to_string(),
                p.parse::<u16>()
                    .map_err(|_| anyhow!("bad port {p:?} in URI {s}"))?,
            ),
            _ => (hostport.to_string(), 5672),
        };
        if host.is_empty() {
            bail!("URI has no host: {s}");
        }
        let vhost = match path.map(|p| p.split('?').next().unwrap_or("")) {
            None | Some("") => "/".to_string(),
            Some(p) => percent_decode(p)?,
        };
        Ok(Uri {
            host,
            port,
            user,
            password,
            vhost,
        })
    }
}

/// The socket and the read state of one AMQP connection after the handshake.
pub struct Connection {
    pub stream: TcpStream,
    pub rbuf: Vec<u8>,
    pub rstart: usize,
    pub rend: usize,
    pub wbuf: bytes::BytesMut,
    pub frame_max: u32,
    pub heartbeat_s: u16,
}

impl Connection {
    /// Connects and runs the handshake (PLAIN), negotiating heartbeats as the Java client
    /// does: 0 on one side means "take the other side's value".
    pub async fn open(uri: &Uri, heartbeat_requested_s: u16, name: &str) -> Result<Connection> {
        let stream = tokio::time::timeout(
            RPC_TIMEOUT,
            TcpStream::connect((uri.host.as_str(), uri.port)),
        )
        .await
        .map_err(|_| anyhow!("timed out connecting to {}:{}", uri.host, uri.port))?
        .with_context(|| format!("cannot connect to {}:{}", uri.host, uri.port))?;
        stream.set_nodelay(true)?;
        let mut conn = Connection {
            stream,
            rbuf: vec![0; READ_BUF_BYTES],
            rstart: 0,
            rend: 0,
            wbuf: bytes::BytesMut::with_capacity(64 * 1024),
            frame_max: wire::FRAME_SIZE_MAX,
            heartbeat_s: 0,
        };
        tokio::time::timeout(
            RPC_TIMEOUT,
            conn.handshake(uri, heartbeat_requested_s, name),
        )
        .await
        .map_err(|_| anyhow!("handshake with {}:{} timed out", uri.host, uri.port))??;
        Ok(conn)
    }

    async fn handshake(&mut self, uri: &Uri, heartbeat_requested_s: u16, name: &str) -> Result<()> {
        wire::protocol_header(&mut self.wbuf);
        self.flush().await?;
        self.expect(0, method::CONNECTION_START).await?;
        wire::connection_start_ok(&mut self.wbuf, &uri.user, &uri.password, name);
        self.flush().await?;
        let tune = self
            .expect(0, method::CONNECTION_TUNE)
            .await
            .map_err(|e| anyhow!("{e} (wrong user or password for {}?)", uri.user))?;
        let mut args = wire::Args::new(&tune);
        let channel_max = args.u16()?;
        let frame_max_server = args.u32()?;
        let heartbeat_server = args.u16()?;
        let frame_max = match frame_max_server {
            0 => FRAME_MAX_REQUESTED,
            f => f.min(FRAME_MAX_REQUESTED),
        };
        let heartbeat = if heartbeat_requested_s == 0 || heartbeat_server == 0 {
            heartbeat_requested_s.max(heartbeat_server)
        } else {
            heartbeat_requested_s.min(heartbeat_server)
        };
        wire::connection_tune_ok(&mut self.wbuf, channel_max.min(16), frame_max, heartbeat);
        wire::connection_open(&mut self.wbuf, &uri.vhost);
        self.flush().await?;
        self.expect(0, method::CONNECTION_OPEN_OK).await?;
        self.frame_max = frame_max;
        self.heartbeat_s = heartbeat;
        Ok(())
    }

    pub async fn flush(&mut self) -> Result<()> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        Ok(())
    }

    /// Reads more bytes into the read buffer, compacting it first; errors on EOF.
    pub async fn fill(&mut self) -> Result<usize> {
        if self.rstart > 0 {
            self.rbuf.copy_within(self.rstart..self.rend, 0);
            self.rend -= self.rstart;
            self.rstart = 0;
        }
        if self.rend == self.rbuf.len() {
            // A frame larger than the buffer (up to frame_max): grow to hold it, bounded by
            // the negotiated frame size.
            let want = self.frame_max as usize + wire::FRAME_OVERHEAD_BYTES;
            if self.rbuf.len() >= want {
                bail!(
                    "read buffer full without a complete frame (frame_max {})",
                    self.frame_max
                );
            }
            self.rbuf.resize(want, 0);
        }
        let n = self.stream.read(&mut self.rbuf[self.rend..]).await?;
        if n == 0 {
            bail!("the broker closed the connection");
        }
        self.rend += n;
        Ok(n)
    }

    /// Waits for the method `want` on `channel`, skipping heartbeats and stray content, and
    /// turns a close from the broker into an error that carries its reply code and text.
    pub async fn expect(&mut self, channel: u16, want: (u16, u16)) -> Result<Vec<u8>> {
        loop {
            while let Some((frame, used)) =
                wire::parse_frame(&self.rbuf[self.rstart..self.rend], self.frame_max)?
            {
                let outcome = classify(frame, channel, want)?;
                self.rstart += used;
                match outcome {
                    Classified::Wanted(args) => return Ok(args),
                    Classified::ConnectionClosed(reason) => {
                        wire::connection_close_ok(&mut self.wbuf);
                        let _ = self.flush().await;
                        bail!("broker closed the connection: {reason}");
                    }
                    Classified::ChannelClosed(reason) => {
                        wire::channel_close_ok(&mut self.wbuf, channel);
                        let _ = self.flush().await;
                        bail!("broker closed the channel: {reason}");
                    }
                    Classified::Other => {}
                }
            }
            self.fill().await?;
        }
    }

    /// Sends what is in the write buffer and waits for `want`, within [`RPC_TIMEOUT`].
    pub async fn call(&mut self, channel: u16, want: (u16, u16)) -> Result<Vec<u8>> {
        self.flush().await?;
        tokio::time::timeout(RPC_TIMEOUT, self.expect(channel, want))
            .await
            .map_err(|_| anyhow!("broker did not answer {want:?} within {RPC_TIMEOUT:?}"))?
    }

    pub async fn open_channel(&mut self, channel: u16) -> Result<()> {
        wire::channel_open(&mut self.wbuf, channel);
        self.call(channel, method::CHANNEL_OPEN_OK)
            .await
            .map(|_| ())
    }

    pub async fn confirm_select(&mut self, channel: u16) -> Result<()> {
        wire::confirm_select(&mut self.wbuf, channel);
        self.call(channel, method::CONFIRM_SELECT_OK)
            .await
            .map(|_| ())
    }

    pub async fn declare_exchange(
        &mut self,
        channel: u16,
        name: &str,
        kind: &str,
        durable: bool,
    ) -> Result<()> {
        wire::exchange_declare(&mut self.wbuf, channel, name, kind, durable);
        self.call(channel, method::EXCHANGE_DECLARE_OK)
            .await
            .with_context(|| format!("declaring exchange {name:?} of type {kind}"))
            .map(|_| ())
    }

    /// Whether the exchange exists, by a passive declare on `channel`. The broker closes the
    /// channel when it does not: open another one after `false`.
    pub async fn exchange_exists(&mut self, channel: u16, name: &str) -> Result<bool> {
        wire::exchange_declare_passive(&mut self.wbuf, channel, name);
        not_found_is_false(self.call(channel, method::EXCHANGE_DECLARE_OK).await)
    }

    /// Whether the queue exists, as [`Connection::exchange_exists`] tells an exchange.
    pub async fn queue_exists(&mut self, channel: u16, name: &str) -> Result<bool> {
        let q = QueueDeclare {
            name,
            passive: true,
            durable: false,
            exclusive: false,
            auto_delete: false,
            arguments: &[],
        };
        wire::queue_declare(&mut self.wbuf, channel, &q);
        not_found_is_false(self.call(channel, method::QUEUE_DECLARE_OK).await)
    }

    pub async fn delete_exchange(&mut self, channel: u16, name: &str) -> Result<()> {
        wire::exchange_delete(&mut self.wbuf, channel, name);
        self.call(channel, method::EXCHANGE_DELETE_OK)
            .await
            .with_context(|| format!("deleting exchange {name:?}"))
            .map(|_| ())
    }

    /// Declares a queue and returns its name (server-named when `name` is empty) and the
    /// number of messages it holds.
    pub async fn declare_queue(
        &mut self,
        channel: u16,
        name: &str,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: &[(String, FieldValue)],
    ) -> Result<(String, u32)> {
        let q = QueueDeclare {
            name,
            passive: false,
            durable,
            exclusive,
            auto_delete,
            arguments,
        };
        wire::queue_declare(&mut self.wbuf, channel, &q);
        let ok = self
            .call(channel, method::QUEUE_DECLARE_OK)
            .await
            .with_context(|| format!("declaring queue {name:?}"))?;
        let mut args = wire::Args::new(&ok);
        let actual = args.shortstr()?.to_string();
        let messages = args.u32()?;
        Ok((actual, messages))
    }

    pub async fn bind_queue(
        &mut self,
        channel: u16,
        queue: &str,
        exchange: &str,
        routing_key: &str,
    ) -> Result<()> {
        wire::queue_bind(&mut self.wbuf, channel, queue, exchange, routing_key);
        self.call(channel, method::QUEUE_BIND_OK)
            .await
            .with_context(|| {
                format!("binding queue {queue:?} to {exchange:?} with {routing_key:?}")
            })
            .map(|_| ())
    }

    pub async fn purge_queue(&mut self, channel: u16, queue: &str) -> Result<u32> {
        wire::queue_purge(&mut self.wbuf, channel, queue);
        let ok = self.call(channel, method::QUEUE_PURGE_OK).await?;
        Ok(wire::Args::new(&ok).u32()?)
    }

    pub async fn delete_queue(&mut self, channel: u16, queue: &str) -> Result<u32> {
        wire::queue_delete(&mut self.wbuf, channel, queue);
        let ok = self
            .call(channel, method::QUEUE_DELETE_OK)
            .await
            .with_context(|| format!("deleting queue {queue:?}"))?;
        Ok(wire::Args::new(&ok).u32()?)
    }

    pub async fn qos(&mut self, channel: u16, prefetch: u16) -> Result<()> {
        wire::basic_qos(&mut self.wbuf, channel, prefetch, false);
        self.call(channel, method::BASIC_QOS_OK).await.map(|_| ())
    }

    pub async fn consume(
        &mut self,
        channel: u16,
        queue: &str,
        tag: &str,
        no_ack: bool,
        arguments: &[(String, FieldValue)],
    ) -> Result<()> {
        wire::basic_consume(&mut self.wbuf, channel, queue, tag, no_ack, arguments);
        self.call(channel, method::BASIC_CONSUME_OK)
            .await
            .with_context(|| format!("consuming from queue {queue:?}"))
            .map(|_| ())
    }

    /// Closes politely; errors are ignored because the run's results are already taken.
    pub async fn close(mut self) {
        wire::connection_close(&mut self.wbuf, 200, "bye");
        if self.flush().await.is_ok() {
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                self.expect(0, method::CONNECTION_CLOSE_OK),
            )
            .await;
        }
    }
}

enum Classified {
    Wanted(Vec<u8>),
    ConnectionClosed(CloseReason),
    ChannelClosed(CloseReason),
    Other,
}

fn classify(frame: Frame<'_>, channel: u16, want: (u16, u16)) -> Result<Classified> {
    if frame.kind != FRAME_METHOD {
        return Ok(Classified::Other);
    }
    let (id, args) = wire::method_of(frame.payload)?;
    if id == method::CONNECTION_CLOSE {
        return Ok(Classified::ConnectionClosed(wire::parse_close(args)?));
    }
    if frame.channel == channel && id == method::CHANNEL_CLOSE {
        return Ok(Classified::ChannelClosed(wire::parse_close(args)?));
    }
    if frame.channel == channel && id == want {
        return Ok(Classified::Wanted(frame.payload[4..].to_vec()));
    }
    Ok(Classified::Other)
}

/// A passive declare's answer: declare-ok is true, a channel closed with 404 false.
fn not_found_is_false(answer: Result<Vec<u8>>) -> Result<bool> {
    match answer {
        Ok(_) => Ok(true),
        Err(e) if format!("{e}").contains("broker closed the channel: 404") => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_parses_user_host_port_and_escaped_vhost() {
        let u = Uri::parse("amqp://guest:guest@10.0.0.1:5672/%2f").unwrap();
        assert_eq!(u.host, "10.0.0.1");
        assert_eq!(u.port, 5672);
        assert_eq!(u.user, "guest");
        assert_eq!(u.vhost, "/");
        let d = Uri::parse("amqp://localhost").unwrap();
        assert_eq!(
            (d.port, d.vhost.as_str(), d.user.as_str()),
            (5672, "/", "guest")
        );
        let v = Uri::parse("amqp://a:b@h:1/prod").unwrap();
        assert_eq!(
            (v.user.as_str(), v.password.as_str(), v.vhost.as_str()),
            ("a", "b", "prod")
        );
        assert!(Uri::parse("http://h").is_err());
        assert!(Uri::parse("amqp://h:notaport/").is_err());
    }
}
