//! The vhost's side of policies: keeping each queue's and exchange's effective configuration
//! in step with the vhost's [`Policies`] as they are set and cleared, without a restart and
//! without touching a message's order.
//!
//! What a policy change does to a queue is what RabbitMQ's `policy_changed` does to a classic
//! queue process: the new limits, TTL, expiry, dead-letter target, overflow and queue mode take
//! effect for what comes next, messages already queued keep their place (and their expiry,
//! which was fixed at publish), and a lowered max-length on a drop-head queue drops or
//! dead-letters from the head. That trimming is left to [`VHost::enforce_limits`], called by
//! the server under its journalling guard, so that the storage releases and dead-letter
//! publishes it causes go where a publish's would; a publish in between trims anyway.

use super::*;
use crate::policy::{self, Matched, Policies, Policy, PolicyKind};
use serde_json::{Map, Value};

impl VHost {
    pub fn policies(&self) -> &Policies {
        &self.policies
    }

    /// Sets (adds or replaces) a policy and applies the vhost's policies again.
    pub fn set_policy(&mut self, kind: PolicyKind, policy: Policy, now_ms: u64) {
        self.policies.set(kind, policy);
        self.apply_policies(now_ms);
    }

    /// Clears a policy; false (and nothing changed) when there was none of that name.
    pub fn clear_policy(&mut self, kind: PolicyKind, name: &str, now_ms: u64) -> bool {
        let cleared = self.policies.clear(kind, name);
        if cleared {
            self.apply_policies(now_ms);
        }
        cleared
    }

    /// The effective configuration of a queue about to be declared, and the names of the
    /// policy and operator policy that gave it.
    pub(super) fn queue_policy(
        &self,
        name: &str,
        declared: &QueueConfig,
        arguments: &FieldTable,
    ) -> (QueueConfig, Option<String>, Option<String>) {
        let m = self.policies.for_queue(name, declared.queue_type);
        let config = policy::queue_config(declared, arguments, &m.effective_definition());
        (config, m.policy_name(), m.operator_name())
    }

    /// An exchange's alternate and policy names, from its arguments and the policies.
    pub(super) fn exchange_policy(
        &self,
        name: &str,
        arguments: &FieldTable,
    ) -> (Option<String>, Option<String>, Option<String>) {
        let m = self.policies.for_exchange(name);
        let alternate = policy::alternate_exchange(arguments, &m.effective_definition());
        (alternate, m.policy_name(), m.operator_name())
    }

    /// The merged definition of the named policies, as `/api/queues` shows it.
    pub(super) fn effective_definition(
        &self,
        policy: Option<&str>,
        operator: Option<&str>,
    ) -> Map<String, Value> {
        Matched {
            policy: policy.and_then(|n| self.policies.get(PolicyKind::Policy, n)),
            operator: operator.and_then(|n| self.policies.get(PolicyKind::Operator, n)),
        }
        .effective_definition()
    }

    /// Re-derives every queue's and exchange's configuration from its arguments and the
    /// current policies. Queues whose length limits may now be exceeded are left for
    /// [`VHost::enforce_limits`].
    fn apply_policies(&mut self, now_ms: u64) {
        let ids: Vec<QueueId> = self.queues.keys().copied().collect();
        for id in ids {
            let q = &self.queues[&id];
            let declared = match QueueConfig::parse(&q.arguments, &q.name, &self.name) {
                Ok(c) => c,
                // Its arguments were valid when it was declared and validation only changes
                // with warren's version: keep what it has.
                Err(_) => q.config.clone(),
            };
            let (config, policy, operator) = self.queue_policy(&q.name, &declared, &q.arguments);
            let q = self.queues.get_mut(&id).expect("listed queue exists");
            q.policy = policy;
            q.operator_policy = operator;
            if config == q.config {
                continue;
            }
            let old = std::mem::replace(&mut q.config, config);
            if old.stream != q.config.stream {
                if let Some((log, stream)) = super::stream::stream_config(q) {
                    self.streams_reconfigured.push((log, stream));
                }
            }
            if old.expires_ms != q.config.expires_ms {
                // rabbit_amqqueue_process re-arms the expiry timer from now.
                q.last_used_ms = now_ms;
            }
            let paging_changed = old.lazy != q.config.lazy
                || old.max_in_memory_length != q.config.max_in_memory_length
                || old.max_in_memory_bytes != q.config.max_in_memory_bytes;
            if paging_changed {
                if let Some(paging) = &self.paging {
                    q.enable_paging(paging.clone());
                }
            }
            if q.exceeds_limit() && !self.limits_due.contains(&id) {
                self.limits_due.push(id);
            }
        }
        let ids: Vec<ExchangeId> = self.exchanges.keys().copied().collect();
        for id in ids {
            let x = &self.exchanges[&id];
            let (alternate, policy, operator) = self.exchange_policy(&x.name, &x.arguments);
            let x = self.exchanges.get_mut(&id).expect("listed exchange exists");
            x.policy = policy;
            x.operator_policy = operator;
            if x.alternate != alternate {
                self.set_alternate(id, alternate);
            }
        }
    }

    /// Points exchange `id` at a new alternate (by name), keeping the index of exchanges by the
    /// alternate they want in step.
    fn set_alternate(&mut self, id: ExchangeId, alternate: Option<String>) {
        let x = self.exchanges.get_mut(&id).expect("exchange exists");
        if let Some(old) = std::mem::replace(&mut x.alternate, alternate.clone()) {
            if let Some(list) = self.alternate_wanted_by.get_mut(&old) {
                list.retain(|w| *w != id);
                if list.is_empty() {
                    self.alternate_wanted_by.remove(&old);
                }
            }
        }
        let alt_id = alternate.as_ref().and_then(|a| {
            self.alternate_wanted_by
                .entry(a.clone())
                .or_default()
                .push(id);
            self.exchanges_by_name.get(a).copied()
        });
        let _ = self.routes.set_alternate_exchange(id, alt_id);
    }

    /// Trims the queues a policy change left over their length limits: drop-head queues lose
    /// (or dead-letter, reason `maxlen`) their oldest messages, as RabbitMQ's
    /// `init_max_length` does; reject-publish queues keep theirs and refuse new ones.
    pub fn enforce_limits(&mut self, now_ms: u64) {
        if self.limits_due.is_empty() {
            return;
        }
        let mut dead = Vec::new();
        for id in std::mem::take(&mut self.limits_due) {
            let Some(q) = self.queues.get_mut(&id) else {
                continue;
            };
            if !super::hosts(&self.local_node, q) {
                continue;
            }
            super::delivery::drop_head_over_limit(q, &mut dead);
        }
        // Releases the dropped messages' stored copies too, dead-lettered or not.
        self.dead_letter(dead, now_ms);
    }

    /// The records that set this vhost's policies, operator policies last.
    pub(super) fn policy_records(&self) -> Vec<MetaRecord> {
        let mut out = Vec::new();
        for kind in [PolicyKind::Policy, PolicyKind::Operator] {
            for p in self.policies.list(kind) {
                out.push(MetaRecord::SetPolicy {
                    vhost: self.name.clone(),
                    name: p.name.clone(),
                    kind,
                    pattern: p.pattern.clone(),
                    apply_to: p.apply_to.name().to_string(),
                    priority: p.priority.clone(),
                    definition: p.definition.clone(),
                });
            }
        }
        out
    }

    /// The streams a policy change gave a new retention or segment size since the last call,
    /// with their effective configuration: their logs apply it from now on, as RabbitMQ's
    /// stream coordinator applies a policy to a running stream.
    pub fn take_reconfigured_streams(&mut self) -> Vec<(u64, crate::stream_args::StreamConfig)> {
        std::mem::take(&mut self.streams_reconfigured)
    }

    /// Whether a policy change left queues to trim (see [`VHost::enforce_limits`]).
    pub fn has_limits_due(&self) -> bool {
        !self.limits_due.is_empty()
    }
}
