//! Subscriptions: a reader per subscription from its offset specification, chunk credit,
//! single active consumer groups (activation asked of the client), unsubscribe.

use super::*;

impl Connection {
    pub(super) fn subscribe(
        &mut self,
        correlation_id: u32,
        subscription_id: u8,
        stream: String,
        offset: OffsetSpec,
        credit: u16,
        properties: Vec<(String, String)>,
    ) {
        let respond = |me: &Connection, code| me.respond(KEY_SUBSCRIBE, correlation_id, code);
        if self.subscriptions.contains_key(&subscription_id) {
            return respond(self, RESPONSE_CODE_SUBSCRIPTION_ID_ALREADY_EXISTS);
        }
        let writer = match self.writer_of(&stream) {
            Ok(w) => w,
            Err(code) => return respond(self, code),
        };
        if !self.allowed(Access::Read, &stream) {
            return respond(self, RESPONSE_CODE_ACCESS_REFUSED);
        }
        let property = |k: &str| {
            properties
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        let single_active = property("single-active-consumer") == Some("true");
        let group = match (single_active, property("name")) {
            (false, _) => None,
            (true, Some(name)) if !name.is_empty() => Some((stream.clone(), name.to_string())),
            // A single active consumer needs a name to be grouped by.
            (true, _) => return respond(self, RESPONSE_CODE_PRECONDITION_FAILED),
        };
        let control = Arc::new(SubscriptionControl::new(credit));
        let counters = Arc::new(ConsumerCounters::default());
        counters.credit.store(u64::from(credit), Relaxed);
        let active = match &group {
            None => true,
            Some(key) => {
                self.shared
                    .stream_groups
                    .join(&self.vhost_name, key, self.id, subscription_id)
            }
        };
        self.shared.stream_connections.update(self.id, |c| {
            c.consumers.insert(
                subscription_id,
                ConsumerInfo {
                    subscription_id,
                    stream: stream.clone(),
                    properties: properties.clone(),
                    active,
                    counters: counters.clone(),
                },
            );
        });
        self.subscriptions.insert(
            subscription_id,
            Subscription {
                stream,
                writer,
                offset,
                control,
                counters,
                group: group.clone(),
                started: false,
            },
        );
        respond(self, RESPONSE_CODE_OK);
        match (group, active) {
            (None, _) => self.start_reader(subscription_id, offset),
            // The active member of a group asks its client where to start.
            (Some(_), true) => self.ask_activation(subscription_id),
            (Some(_), false) => {}
        }
    }

    pub(super) fn start_reader(&mut self, subscription_id: u8, offset: OffsetSpec) {
        let Some(s) = self.subscriptions.get_mut(&subscription_id) else {
            return;
        };
        if s.started {
            return;
        }
        s.started = true;
        subscription::start(
            s.writer.clone(),
            s.stream.clone(),
            subscription_id,
            offset,
            s.control.clone(),
            s.counters.clone(),
            self.out.clone(),
        );
    }

    pub(super) fn ask_activation(&mut self, subscription_id: u8) {
        self.next_correlation += 1;
        let correlation_id = self.next_correlation;
        self.consumer_updates
            .insert(correlation_id, subscription_id);
        self.shared.stream_connections.update(self.id, |c| {
            if let Some(consumer) = c.consumers.get_mut(&subscription_id) {
                consumer.active = true;
            }
        });
        self.send(Command::ConsumerUpdate {
            correlation_id,
            subscription_id,
            active: true,
        });
    }

    pub(super) fn consumer_update_answered(
        &mut self,
        correlation_id: u32,
        offset: Option<OffsetSpec>,
    ) {
        let Some(subscription_id) = self.consumer_updates.remove(&correlation_id) else {
            return;
        };
        let Some(s) = self.subscriptions.get(&subscription_id) else {
            return;
        };
        let offset = offset.unwrap_or(s.offset);
        self.start_reader(subscription_id, offset);
    }

    /// Ends a subscription; false when there was none. Its group, if any, hands over.
    pub(super) fn unsubscribe(&mut self, subscription_id: u8) -> bool {
        let Some(s) = self.subscriptions.remove(&subscription_id) else {
            return false;
        };
        s.control.stop();
        self.shared.stream_connections.update(self.id, |c| {
            c.consumers.remove(&subscription_id);
        });
        if let Some(key) = s.group {
            if let Some((conn, sub)) =
                self.shared
                    .stream_groups
                    .leave(&self.vhost_name, &key, self.id, subscription_id)
            {
                if conn == self.id {
                    self.ask_activation(sub);
                } else {
                    self.shared.stream_connections.tell(
                        conn,
                        Control::Activate {
                            subscription_id: sub,
                        },
                    );
                }
            }
        }
        true
    }
}
