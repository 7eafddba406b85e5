//! The handshake's last two steps: SASL authentication against the node's users and the
//! vhost a connection opens (with its permissions and limits).

use super::*;

impl Connection {
    pub(super) fn authenticate(
        &mut self,
        correlation_id: u32,
        mechanism: &str,
        data: &[u8],
    ) -> Flow {
        let refuse = |me: &mut Connection, code: u16, why: &str| {
            me.shared.counters.auth_failures.fetch_add(1, Relaxed);
            tracing::warn!(peer = %me.who.peer, mechanism, "stream login refused: {why}");
            me.send(Command::SaslAuthenticateResponse {
                correlation_id,
                code,
                challenge: Default::default(),
            });
            // RabbitMQ closes the socket after a failed login.
            me.phase = Phase::Closing;
            Flow::Close
        };
        if !self.mechanism_offered.iter().any(|m| m == mechanism) {
            return refuse(
                self,
                RESPONSE_CODE_SASL_MECHANISM_NOT_SUPPORTED,
                &format!("mechanism {mechanism} not offered"),
            );
        }
        let (user, password) = match crate::amqp::handshake::credentials(mechanism, data) {
            Ok(c) => c,
            Err(e) => return refuse(self, RESPONSE_CODE_SASL_ERROR, &e.text),
        };
        let authenticated = self
            .shared
            .broker
            .users
            .read()
            .expect("users lock")
            .authenticate(&user, &password);
        if !authenticated {
            return refuse(
                self,
                RESPONSE_CODE_AUTHENTICATION_FAILURE,
                &format!("invalid credentials for user '{user}'"),
            );
        }
        if crate::amqp::handshake::loopback_refused(
            &self.shared.config.loopback_users,
            &user,
            self.who.peer.ip(),
        ) {
            return refuse(
                self,
                RESPONSE_CODE_SASL_AUTHENTICATION_FAILURE_LOOPBACK,
                &format!("user '{user}' may only connect via localhost"),
            );
        }
        self.user = user;
        self.send(Command::SaslAuthenticateResponse {
            correlation_id,
            code: RESPONSE_CODE_OK,
            challenge: Default::default(),
        });
        self.send(Command::Tune {
            frame_max: frame_max_offered(),
            heartbeat_s: HEARTBEAT_DEFAULT_S,
        });
        self.phase = Phase::Tune;
        Flow::Continue
    }

    pub(super) fn open(&mut self, correlation_id: u32, vhost_name: String) -> Flow {
        let vhost = self.shared.broker.vhost(&vhost_name);
        let permissions = self
            .shared
            .broker
            .users
            .read()
            .expect("users lock")
            .permissions(&self.user, &vhost_name)
            .cloned();
        let (Some(vhost), Some(permissions)) = (vhost, permissions) else {
            tracing::warn!(peer = %self.who.peer, user = %self.user, vhost = %vhost_name,
                "stream connection refused access to the vhost");
            self.send(Command::OpenResponse {
                correlation_id,
                code: RESPONSE_CODE_VIRTUAL_HOST_ACCESS_FAILURE,
                properties: Vec::new(),
            });
            self.phase = Phase::Closing;
            return Flow::Close;
        };
        self.vhost = Some(vhost);
        self.permissions = Some(permissions);
        self.vhost_name = vhost_name;
        let (host, port) = self.advertised();
        self.send(Command::OpenResponse {
            correlation_id,
            code: RESPONSE_CODE_OK,
            properties: vec![
                ("advertised_host".into(), host),
                ("advertised_port".into(), port.to_string()),
            ],
        });
        self.phase = Phase::Opened;
        self.shared.stream_connections.register(
            ConnectionInfo {
                id: self.id,
                peer: self.who.peer,
                local: self.who.local,
                user: self.user.clone(),
                vhost: self.vhost_name.clone(),
                tls: self.who.tls,
                frame_max: self.frame_max,
                heartbeat_s: self.heartbeat_s,
                client_properties: self.client_properties.clone(),
                connected_at_ms: now_ms(),
                publishers: BTreeMap::new(),
                consumers: BTreeMap::new(),
            },
            self.control.clone(),
        );
        self.registered = true;
        Flow::Continue
    }
}
