//! Addresses as operators write them: `HOST:PORT`, where HOST is a name, an IPv4 literal or a
//! bracketed IPv6 literal.
//!
//! A node keeps an address as written and resolves it each time it dials, because on the
//! machines a cluster runs on the name is what stays: a Kubernetes pod or a VM that is
//! rescheduled comes back under its name with another IP, and a resolver's cache may hold the
//! old one for a while, so a failed dial resolves again rather than keep a stale address.
//! Written with an IP literal, an address serialises exactly as a `SocketAddr` does, so nodes
//! of older builds (which read addresses as `SocketAddr`) still read every address a node of
//! this build sends them as long as the cluster is configured with IP literals.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::str::FromStr;

/// The longest host name DNS allows (RFC 1035), so a bad value is refused with a message rather
/// than sent to the resolver.
const HOST_NAME_BYTES_MAX: usize = 253;

/// A `HOST:PORT` address, kept as written.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    host: Host,
    port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Host {
    Ip(IpAddr),
    Name(String),
}

impl HostPort {
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The host part as written (an IPv6 literal without its brackets).
    pub fn host(&self) -> String {
        match &self.host {
            Host::Ip(ip) => ip.to_string(),
            Host::Name(n) => n.clone(),
        }
    }

    /// The IP literal, when the address is one.
    pub fn ip(&self) -> Option<IpAddr> {
        match self.host {
            Host::Ip(ip) => Some(ip),
            Host::Name(_) => None,
        }
    }

    /// `0.0.0.0` or `::`: every interface, which peers cannot dial.
    pub fn is_unspecified(&self) -> bool {
        self.ip().is_some_and(|ip| ip.is_unspecified())
    }

    /// A name with `port`: `HostPort::named("warren-0", 25672)`.
    pub fn named(host: &str, port: u16) -> Result<HostPort, String> {
        format!("{}:{port}", bracket(host)).parse()
    }

    /// The addresses the name stands for now, blocking in the system's resolver: for start-up,
    /// where nothing else waits on the thread.
    pub fn resolve_blocking(&self) -> Result<Vec<SocketAddr>, String> {
        match &self.host {
            Host::Ip(ip) => Ok(vec![SocketAddr::new(*ip, self.port)]),
            Host::Name(name) => {
                let found: Vec<SocketAddr> = (name.as_str(), self.port)
                    .to_socket_addrs()
                    .map_err(|e| format!("{self} does not resolve: {e}"))?
                    .collect();
                if found.is_empty() {
                    return Err(format!("{self} resolves to no address"));
                }
                Ok(found)
            }
        }
    }

    /// The addresses the name stands for now, without blocking the runtime.
    pub async fn resolve(&self) -> Result<Vec<SocketAddr>, String> {
        match &self.host {
            Host::Ip(ip) => Ok(vec![SocketAddr::new(*ip, self.port)]),
            Host::Name(name) => {
                let found: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), self.port))
                    .await
                    .map_err(|e| format!("{self} does not resolve: {e}"))?
                    .collect();
                if found.is_empty() {
                    return Err(format!("{self} resolves to no address"));
                }
                Ok(found)
            }
        }
    }
}

fn bracket(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

impl From<SocketAddr> for HostPort {
    fn from(a: SocketAddr) -> HostPort {
        HostPort {
            host: Host::Ip(a.ip()),
            port: a.port(),
        }
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(ip) => SocketAddr::new(*ip, self.port).fmt(f),
            Host::Name(n) => write!(f, "{n}:{}", self.port),
        }
    }
}

impl FromStr for HostPort {
    type Err = String;

    fn from_str(s: &str) -> Result<HostPort, String> {
        let s = s.trim();
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(a.into());
        }
        let bad = |why: &str| {
            format!("invalid address {s:?}: {why} (expected HOST:PORT, e.g. warren-0.warren:25672, 10.0.0.5:25672 or [fd00::5]:25672)")
        };
        let (host, port) = s.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        let port: u16 = port.parse().map_err(|_| bad("the port is not 0-65535"))?;
        if host.starts_with('[') || host.contains(':') {
            return Err(bad("an IPv6 address goes in brackets"));
        }
        if host.is_empty() || host.len() > HOST_NAME_BYTES_MAX {
            return Err(bad("no host"));
        }
        let name_ok = host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
        // A trailing dot (an absolute name) is allowed.
        let name_ok = name_ok
            || (host.ends_with('.') && host.len() > 1 && {
                let inner = &host[..host.len() - 1];
                !inner.ends_with('.') && HostPort::from_str(&format!("{inner}:{port}")).is_ok()
            });
        if !name_ok {
            return Err(bad("the host is neither an IP address nor a DNS name"));
        }
        if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return Err(bad("the host is not a valid IPv4 address"));
        }
        Ok(HostPort {
            host: Host::Name(host.to_ascii_lowercase()),
            port,
        })
    }
}

impl Serialize for HostPort {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HostPort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<HostPort, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Whether `ip` is one of this machine's (this network namespace's) addresses: only then can a
/// socket be bound to it.
pub fn is_local_ip(ip: IpAddr) -> bool {
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// This machine's host name, as `hostname` prints it.
pub fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length, and gethostname NUL-terminates within it or
    // fails.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = std::str::from_utf8(&buf[..end]).ok()?.trim().to_string();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_literals_read_and_print_as_socket_addresses_do() {
        for s in [
            "127.0.0.1:25672",
            "[::1]:25672",
            "[fd00::5]:1",
            "0.0.0.0:5672",
        ] {
            let a: HostPort = s.parse().unwrap();
            assert_eq!(a.to_string(), s.parse::<SocketAddr>().unwrap().to_string());
            assert_eq!(
                serde_json::to_string(&a).unwrap(),
                serde_json::to_string(&s.parse::<SocketAddr>().unwrap()).unwrap()
            );
        }
        assert!("0.0.0.0:5672".parse::<HostPort>().unwrap().is_unspecified());
        assert!("[::]:5672".parse::<HostPort>().unwrap().is_unspecified());
    }

    #[test]
    fn names_are_kept_as_written_in_lower_case() {
        let a: HostPort = "Warren-0.warren.default.svc:25672".parse().unwrap();
        assert_eq!(a.to_string(), "warren-0.warren.default.svc:25672");
        assert_eq!(a.host(), "warren-0.warren.default.svc");
        assert_eq!(a.port(), 25672);
        assert_eq!(a.ip(), None);
        let back: HostPort = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(back, a);
        assert!("host.:1".parse::<HostPort>().is_ok());
        assert_eq!(
            HostPort::named("fd00::1", 7).unwrap().to_string(),
            "[fd00::1]:7"
        );
    }

    #[test]
    fn bad_addresses_are_refused_with_what_was_expected() {
        for s in [
            "warren-0",
            "warren-0:",
            "warren-0:99999",
            ":5672",
            "fd00::1:5672",
            "bad host:1",
            "-bad:1",
            "a..b:1",
            "300.1.1.1:5",
            "1.2.3:5",
            "",
        ] {
            let e = s.parse::<HostPort>().unwrap_err();
            assert!(e.contains("HOST:PORT"), "{s}: {e}");
        }
    }

    #[test]
    fn localhost_resolves_and_is_local() {
        let a: HostPort = "localhost:5".parse().unwrap();
        let found = a.resolve_blocking().unwrap();
        assert!(found.iter().all(|s| s.port() == 5 && is_local_ip(s.ip())));
        assert!(!is_local_ip("192.0.2.1".parse().unwrap()));
        assert!(host_name().is_some());
    }
}
