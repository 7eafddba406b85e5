//! Publisher confirms: each channel's publishes wait, in order, for what they were stored in
//! (this node's WAL, a queue's node for a forward, a quorum queue's group); an ack(multiple)
//! goes out for the longest confirmed run, a nack for what was refused.

use crate::amqp::connection::Connection;
use warren_protocol::method::{self, Method};

impl Connection {
    /// Sends the pending publisher confirms of every channel as one ack(multiple) each.
    pub fn has_pending_confirms(&self) -> bool {
        self.channels
            .values()
            .any(|c| !c.pending_confirms.is_empty())
    }

    pub fn flush_confirms(&mut self) {
        let durability = self.shared.durability.clone();
        for (number, ch) in self.channels.iter_mut() {
            while let Some((seq, waits)) = ch.pending_confirms.front() {
                if durability.has_failed() || durability.any_refused(waits) {
                    durability.forget_refusal(waits);
                    // Confirms before it go first: an ack(multiple) sent after the nack
                    // must not be the first word on them.
                    if let Some(upto) = ch.ack_upto.take() {
                        self.shared.counters.confirmed.fetch_add(
                            upto - ch.confirmed_upto,
                            std::sync::atomic::Ordering::Relaxed,
                        );
                        let multiple = upto > ch.confirmed_upto + 1;
                        ch.confirmed_upto = upto;
                        let n = *number;
                        self.outbox
                            .push(|b| method::encode_ack(b, n, upto, multiple));
                    }
                    // The engine stopped, the queue's node refused it or the link to that
                    // node broke: it will never be confirmed, so it is refused.
                    let nack = Method::Nack(method::Nack {
                        delivery_tag: *seq,
                        multiple: false,
                        requeue: false,
                    });
                    let n = *number;
                    self.outbox.push(|b| nack.encode(n, b));
                } else if durability.all_durable(waits) {
                    ch.ack_upto = Some(*seq);
                } else {
                    break;
                }
                ch.pending_confirms.pop_front();
            }
            if let Some(seq) = ch.ack_upto.take() {
                self.shared.counters.confirmed.fetch_add(
                    seq - ch.confirmed_upto,
                    std::sync::atomic::Ordering::Relaxed,
                );
                // One message is confirmed with multiple=false, as RabbitMQ does: clients
                // that count confirms per tag must see single ones.
                let multiple = seq > ch.confirmed_upto + 1;
                ch.confirmed_upto = seq;
                let n = *number;
                self.outbox
                    .push(|b| method::encode_ack(b, n, seq, multiple));
            }
        }
    }
}
