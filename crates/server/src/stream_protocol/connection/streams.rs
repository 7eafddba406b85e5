//! Streams as topology: create and delete through the one topology path (the same queue
//! record as an AMQP 0-9-1 declare), metadata with the advertised leader.

use super::*;

impl Connection {
    pub(super) async fn create(&mut self, stream: String, arguments: Vec<(String, String)>) -> u16 {
        if !self.allowed(Access::Configure, &stream) {
            return RESPONSE_CODE_ACCESS_REFUSED;
        }
        let table = match declare_arguments(&arguments) {
            Ok(t) => t,
            Err(why) => {
                tracing::info!(stream, why, "stream create refused");
                return RESPONSE_CODE_PRECONDITION_FAILED;
            }
        };
        let existed = self
            .vhost()
            .lock()
            .expect("vhost lock")
            .stream_of(&stream)
            .is_some();
        let command = Topo::QueueDeclare {
            vhost: self.vhost_name.clone(),
            conn: self.id,
            name: stream.clone(),
            durable: true,
            exclusive: false,
            auto_delete: false,
            server_named: false,
            arguments: table,
            log_id: crate::topology::placement::rand_log_id(),
            node: String::new(),
            members: Vec::new(),
            at_unix_ms: now_ms(),
        };
        match crate::topology::of(&self.shared).change(command).await {
            Ok(_) if existed => RESPONSE_CODE_STREAM_ALREADY_EXISTS,
            Ok(_) => RESPONSE_CODE_OK,
            Err(e) => {
                tracing::info!(stream, error = %e.text, "stream create refused");
                code_of(&e)
            }
        }
    }

    pub(super) async fn delete(&mut self, stream: String) -> u16 {
        let exists = self
            .vhost()
            .lock()
            .expect("vhost lock")
            .stream_of(&stream)
            .is_some();
        if !exists {
            return RESPONSE_CODE_STREAM_DOES_NOT_EXIST;
        }
        if !self.allowed(Access::Configure, &stream) {
            return RESPONSE_CODE_ACCESS_REFUSED;
        }
        let command = Topo::QueueDelete {
            vhost: self.vhost_name.clone(),
            conn: self.id,
            name: stream.clone(),
        };
        match crate::topology::of(&self.shared).change(command).await {
            Ok(Outcome::QueueDeleted { existed: false, .. }) => RESPONSE_CODE_STREAM_DOES_NOT_EXIST,
            Ok(_) => {
                self.shared
                    .stream_connections
                    .stream_deleted(&self.vhost_name, &stream);
                RESPONSE_CODE_OK
            }
            Err(e) => code_of(&e),
        }
    }

    pub(super) fn metadata(&mut self, correlation_id: u32, streams: Vec<String>) {
        let v = self.vhost().lock().expect("vhost lock");
        let mut out = Vec::with_capacity(streams.len());
        let mut any = false;
        for stream in streams {
            let exists = v.stream_of(&stream).is_some();
            any |= exists;
            out.push(if exists {
                StreamMetadata {
                    stream,
                    code: RESPONSE_CODE_OK,
                    leader: 0,
                    replicas: Vec::new(),
                }
            } else {
                StreamMetadata {
                    stream,
                    code: RESPONSE_CODE_STREAM_DOES_NOT_EXIST,
                    leader: u16::MAX,
                    replicas: Vec::new(),
                }
            });
        }
        drop(v);
        let (host, port) = self.advertised();
        let brokers = if any {
            vec![Broker {
                reference: 0,
                host,
                port: u32::from(port),
            }]
        } else {
            Vec::new()
        };
        self.send(Command::MetadataResponse {
            correlation_id,
            brokers,
            streams: out,
        });
    }
}

/// A Create's arguments as the queue declare arguments RabbitMQ's stream manager makes of
/// them (`x-` prefixed, numbers as numbers), so a stream created either way is the same
/// queue record and a redeclare compares alike. Unreadable values are refused here (RabbitMQ
/// 3.10 crashes on them and never answers); unknown keys are ignored, as RabbitMQ does.
pub fn declare_arguments(arguments: &[(String, String)]) -> Result<FieldTable, String> {
    let mut table = FieldTable::default();
    table.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("stream".into()),
    );
    for (key, value) in arguments {
        let number = || {
            value
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .map(AMQPValue::LongLongInt)
                .ok_or_else(|| format!("{key} must be a number, got '{value}'"))
        };
        match key.as_str() {
            "max-length-bytes" => {
                table.insert("x-max-length-bytes".into(), number()?);
            }
            "stream-max-segment-size-bytes" => {
                table.insert("x-stream-max-segment-size-bytes".into(), number()?);
            }
            "initial-cluster-size" => {
                table.insert("x-initial-cluster-size".into(), number()?);
            }
            "max-age" => {
                if warren_broker::stream_args::parse_duration_ms(value).is_none() {
                    return Err(format!(
                        "max-age must be a duration such as 7D, got '{value}'"
                    ));
                }
                table.insert(
                    "x-max-age".into(),
                    AMQPValue::LongString(value.as_str().into()),
                );
            }
            "queue-leader-locator" => {
                table.insert(
                    "x-queue-leader-locator".into(),
                    AMQPValue::LongString(value.as_str().into()),
                );
            }
            _ => {}
        }
    }
    Ok(table)
}
