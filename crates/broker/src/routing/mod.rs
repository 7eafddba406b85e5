//! A vhost's routing table: exchanges, bindings and the route from a published message to the
//! queues that get it, as a plain data structure with no I/O.
//!
//! Map of the module:
//! - [`RoutingTable`] (this file): exchanges and bindings by small integer ids, the route walk
//!   across exchange-to-exchange bindings and alternate exchanges, the broker's queries.
//! - `topic`: the topic exchange's trie, matched as an NFA over the routing key's words.
//! - `headers`: the headers exchange's `x-match` parsing and RabbitMQ's value comparison.
//! - `identity`: a binding's (source, destination, key, arguments) as bytes, for idempotent bind.
//!
//! The broker keeps names and allocates ids; this table keeps ids only. A publish flows as
//! `route(exchange, key, headers, &mut out)`: the source exchange's index yields the matching
//! bindings (a hash lookup for direct, a trie walk for topic, the whole list for fanout, a
//! lookup per message header for headers); queue destinations go to `out` once each,
//! exchange destinations join a work list once each (cycles are legal and end there); an
//! exchange that matched no binding hands the message to its alternate exchange, if any.
//!
//! Costs, with `k` the key length:
//! declare/delete of an empty exchange O(1); bind and unbind O(k + arguments) amortised,
//! whatever the number of bindings; removing a queue or exchange O(its own bindings);
//! route O(matching destinations) for direct and fanout, O(words x live trie nodes + matches)
//! for topic, and O(message headers x candidate bindings) for headers, where a candidate
//! shares one (key, value) with the message: RabbitMQ scans every headers binding instead.
//! (Worst case, many `all` bindings sharing all but one rare pair, headers stays linear in
//! those candidates; bind files each `all` binding under its currently rarest pair.)
//! Memory, measured by the bench at 100k bindings (heap bytes requested, one queue per
//! binding): about 320 bytes per direct binding, 570 per topic binding (trie nodes), 690
//! per headers binding with two pattern entries (arguments are kept for listing and parsed
//! for matching). Route marks add 4 bytes per exchange, queue and binding id up to the
//! largest in use, per [`RouteScratch`].
//!
//! Concurrency: [`RoutingTable::route`] takes `&mut self` and the table's own scratch;
//! [`RoutingTable::route_with`] takes `&self` and the caller's [`RouteScratch`], so publishers
//! on several threads can route under a read lock while bind and unbind take the write lock.
//!
//! What RabbitMQ does and this table follows:
//! - Binding the same (source, destination, key, arguments) twice is a no-op; arguments are
//!   part of the identity for every exchange kind, but only headers exchanges route on them.
//! - `queue.unbind` and `exchange.unbind` of a binding that does not exist succeed (RabbitMQ
//!   replies unbind-ok); only a missing exchange or queue is 404 NOT_FOUND, which the broker
//!   checks since it knows the names. [`RoutingTable::unbind`] tells whether the binding was there.
//! - An auto-delete exchange goes when its last binding *as source* goes; unbind and removals
//!   report such sources and the broker decides (it knows the auto-delete flag).
//! - An alternate exchange takes a message when its exchange's own bindings matched nothing,
//!   at any depth of an exchange-to-exchange walk, and not when they matched an exchange that
//!   then routed nowhere (checked against RabbitMQ 3.10). Several routing keys (CC, BCC) are
//!   one walk: [`RoutingTable::route_keys`].
//! - The default exchange ("") is not in this table: the broker routes it by queue name.

mod headers;
mod identity;
mod topic;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::fmt;

use amq_protocol_types::{AMQPValue, FieldTable, ShortString};

use headers::{Anchor, HeadersIndex, HeadersMatch};
use topic::{TopicScratch, TopicTrie};

/// Ids are indices into per-table vectors (exchange slots, route marks), so they must stay
/// small: the broker allocates them densely. 2^24 ids cost at most 64 MiB of marks.
pub const ID_COUNT_MAX: u32 = 1 << 24;

/// Routing and binding keys are AMQP short strings.
pub const KEY_BYTES_MAX: usize = 255;

/// An exchange, as the broker numbered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExchangeId(pub u32);

/// A queue, as the broker numbered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId(pub u32);

/// What a binding delivers to: a queue, or another exchange (exchange-to-exchange binding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Destination {
    Queue(QueueId),
    Exchange(ExchangeId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExchangeKind {
    Direct,
    Fanout,
    Topic,
    Headers,
}

impl ExchangeKind {
    /// The kind for an `exchange.declare` type; `None` is RabbitMQ's 503 COMMAND_INVALID
    /// ("unknown exchange type"), for plugin types such as `x-consistent-hash` too.
    pub fn from_name(name: &str) -> Option<ExchangeKind> {
        match name {
            "direct" => Some(ExchangeKind::Direct),
            "fanout" => Some(ExchangeKind::Fanout),
            "topic" => Some(ExchangeKind::Topic),
            "headers" => Some(ExchangeKind::Headers),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
            ExchangeKind::Headers => "headers",
        }
    }
}

/// Why the table refused a command. [`RoutingError::reply_code`] gives the AMQP code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutingError {
    /// No exchange with this id: 404 NOT_FOUND.
    ExchangeNotFound(ExchangeId),
    /// The broker declared an id twice: its bookkeeping is wrong, 541 INTERNAL_ERROR.
    ExchangeAlreadyDeclared(ExchangeId),
    /// An id at or beyond [`ID_COUNT_MAX`]: 541 INTERNAL_ERROR (the broker allocates ids).
    IdOutOfRange(u32),
    /// A binding key longer than a short string: 406 PRECONDITION_FAILED.
    KeyTooLong { bytes: usize },
    /// A headers binding whose `x-match` is a string other than the four modes: 406.
    InvalidXMatch { value: String },
    /// A headers binding whose `x-match` is not a long string: 406.
    InvalidXMatchType { type_name: String, value: String },
}

impl RoutingError {
    pub fn reply_code(&self) -> u16 {
        match self {
            RoutingError::ExchangeNotFound(_) => 404,
            RoutingError::KeyTooLong { .. }
            | RoutingError::InvalidXMatch { .. }
            | RoutingError::InvalidXMatchType { .. } => 406,
            RoutingError::ExchangeAlreadyDeclared(_) | RoutingError::IdOutOfRange(_) => 541,
        }
    }
}

impl fmt::Display for RoutingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RoutingError::ExchangeNotFound(x) => write!(f, "no exchange with id {}", x.0),
            RoutingError::ExchangeAlreadyDeclared(x) => {
                write!(f, "exchange id {} is already declared", x.0)
            }
            RoutingError::IdOutOfRange(id) => {
                write!(f, "id {id} is not below the limit {ID_COUNT_MAX}")
            }
            RoutingError::KeyTooLong { bytes } => {
                write!(f, "key of {bytes} bytes is longer than {KEY_BYTES_MAX}")
            }
            // RabbitMQ's texts, so clients that show them see the same words.
            RoutingError::InvalidXMatch { value } => write!(
                f,
                "Invalid x-match field value <<{value:?}>>; \
                 expected all, any, all-with-x, or any-with-x"
            ),
            RoutingError::InvalidXMatchType { type_name, value } => write!(
                f,
                "Invalid x-match field type {type_name} (value {value}); expected longstr"
            ),
        }
    }
}

impl std::error::Error for RoutingError {}

/// What an unbind did, so the broker can answer and delete auto-delete exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unbound {
    /// False when there was no such binding (still a success in RabbitMQ).
    pub existed: bool,
    /// True when the source exchange has no binding as source any more.
    pub source_unused: bool,
}

/// A binding as the management API lists it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BindingInfo<'a> {
    pub source: ExchangeId,
    pub destination: Destination,
    pub key: &'a [u8],
    /// In key order; [`BindingInfo::args_table`] rebuilds the table.
    pub args: &'a [(ShortString, AMQPValue)],
}

impl BindingInfo<'_> {
    pub fn args_table(&self) -> FieldTable {
        let mut table = FieldTable::default();
        for (key, value) in self.args {
            table.insert(key.clone(), value.clone());
        }
        table
    }
}

/// Index of a binding in [`RoutingTable::bindings`]; never leaves the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BindingId(u32);

/// Where a binding sits in its source's routing index, to remove it in O(1).
#[derive(Debug)]
enum IndexSlot {
    Direct {
        position: u32,
    },
    Topic {
        node: u32,
        position: u32,
    },
    Headers(Box<[Anchor]>),
    /// Fanout exchanges route over their source list.
    SourceList,
}

#[derive(Debug)]
struct Binding {
    source: ExchangeId,
    destination: Destination,
    key: Box<[u8]>,
    /// Kept as a sorted slice rather than a `FieldTable`: a B-tree node is about 600 bytes
    /// even for one entry, and only listing needs a table back.
    args: Box<[(ShortString, AMQPValue)]>,
    /// Position in the source exchange's `as_source` list.
    source_position: u32,
    /// Position in the destination's list (exchange `as_destination` or queue list).
    destination_position: u32,
    slot: IndexSlot,
    /// Parsed once at bind time; only for headers exchanges.
    headers: Option<Box<HeadersMatch>>,
}

#[derive(Debug)]
enum Index {
    Direct(HashMap<Box<[u8]>, Vec<BindingId>>),
    Fanout,
    Topic(TopicTrie),
    Headers(HeadersIndex),
}

#[derive(Debug)]
struct Exchange {
    kind: ExchangeKind,
    alternate: Option<ExchangeId>,
    /// Exchanges whose alternate this one is, so deleting it clears them in O(their count).
    alternate_for: HashSet<ExchangeId>,
    as_source: Vec<BindingId>,
    as_destination: Vec<BindingId>,
    index: Index,
}

/// Buffers a router reuses across calls, so that routing allocates nothing once warm.
///
/// The table keeps one for [`RoutingTable::route`] (`&mut self`). A broker that routes from
/// several threads under a shared (read) lock keeps one per thread or channel and calls
/// [`RoutingTable::route_with`] (`&self`). Its marks grow with the largest ids routed to:
/// 4 bytes per exchange, queue and binding id.
#[derive(Debug, Default)]
pub struct RouteScratch {
    epoch: u32,
    /// `exchange_marks[id] == epoch` when the exchange is already on this route's work list.
    exchange_marks: Vec<u32>,
    /// `queue_marks[id] == epoch` when the queue is already in this route's output.
    queue_marks: Vec<u32>,
    /// `binding_marks[id] == epoch` when a headers binding was already checked.
    binding_marks: Vec<u32>,
    work: Vec<ExchangeId>,
    topic: TopicScratch,
}

impl RouteScratch {
    pub fn new() -> RouteScratch {
        RouteScratch::default()
    }

    /// Grows the marks to the table's id ranges; a no-op unless the table grew.
    fn fit(&mut self, exchange_slots: usize, queue_slots: usize, binding_slots: usize) {
        for (marks, len) in [
            (&mut self.exchange_marks, exchange_slots),
            (&mut self.queue_marks, queue_slots),
            (&mut self.binding_marks, binding_slots),
        ] {
            if marks.len() < len {
                marks.resize(len, 0);
            }
        }
    }

    /// A fresh mark value for one route call; on wrap-around every mark is cleared first.
    fn next_epoch(&mut self) -> u32 {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.exchange_marks.fill(0);
            self.queue_marks.fill(0);
            self.binding_marks.fill(0);
            self.epoch = 1;
        }
        self.epoch
    }
}

/// One vhost's exchanges and bindings. See the module documentation for semantics and costs.
///
/// ```
/// use amq_protocol_types::FieldTable;
/// use warren_broker::routing::{Destination, ExchangeId, ExchangeKind, QueueId, RoutingTable};
///
/// let mut table = RoutingTable::new();
/// let logs = ExchangeId(1);
/// table.declare_exchange(logs, ExchangeKind::Topic)?;
/// table.bind(logs, Destination::Queue(QueueId(7)), b"app.*.error", &FieldTable::default())?;
///
/// let mut queues = Vec::new();
/// table.route(logs, b"app.web.error", None, &mut queues)?;
/// assert_eq!(queues, [QueueId(7)]);
///
/// // Deleting queue 7 leaves `logs` with no binding: the broker deletes it if auto-delete.
/// assert_eq!(table.remove_destination(Destination::Queue(QueueId(7)))?, [logs]);
/// # Ok::<(), warren_broker::routing::RoutingError>(())
/// ```
#[derive(Debug, Default)]
pub struct RoutingTable {
    exchanges: Vec<Option<Exchange>>,
    exchange_count: usize,
    bindings: Vec<Option<Binding>>,
    bindings_free: Vec<u32>,
    binding_count: usize,
    identities: HashMap<Box<[u8]>, BindingId>,
    queue_bindings: HashMap<QueueId, Vec<BindingId>>,
    /// One more than the largest queue id ever bound: the length route marks need.
    queue_slots: usize,
    /// Buffer for a binding's identity bytes in bind and unbind.
    identity: Vec<u8>,
    route_scratch: RouteScratch,
}

fn check_id(id: u32) -> Result<usize, RoutingError> {
    if id < ID_COUNT_MAX {
        Ok(id as usize)
    } else {
        Err(RoutingError::IdOutOfRange(id))
    }
}

fn position(len: usize) -> u32 {
    u32::try_from(len).expect("binding lists are shorter than 2^32")
}

impl RoutingTable {
    pub fn new() -> RoutingTable {
        RoutingTable::default()
    }

    fn exchange(&self, id: ExchangeId) -> Option<&Exchange> {
        self.exchanges.get(id.0 as usize)?.as_ref()
    }

    fn exchange_mut(&mut self, id: ExchangeId) -> Option<&mut Exchange> {
        self.exchanges.get_mut(id.0 as usize)?.as_mut()
    }

    fn binding(&self, id: BindingId) -> &Binding {
        self.bindings[id.0 as usize]
            .as_ref()
            .expect("binding ids in lists are live")
    }

    fn binding_mut(&mut self, id: BindingId) -> &mut Binding {
        self.bindings[id.0 as usize]
            .as_mut()
            .expect("binding ids in lists are live")
    }

    pub fn exchange_count(&self) -> usize {
        self.exchange_count
    }

    pub fn binding_count(&self) -> usize {
        self.binding_count
    }

    pub fn exchange_kind(&self, id: ExchangeId) -> Option<ExchangeKind> {
        self.exchange(id).map(|x| x.kind)
    }

    /// Adds an exchange with no bindings. Equivalence of a redeclare is the broker's business
    /// (it knows durability and arguments), so a second declare of the same id is refused.
    pub fn declare_exchange(
        &mut self,
        id: ExchangeId,
        kind: ExchangeKind,
    ) -> Result<(), RoutingError> {
        let slot = check_id(id.0)?;
        if self.exchanges.len() <= slot {
            self.exchanges.resize_with(slot + 1, || None);
        }
        if self.exchanges[slot].is_some() {
            return Err(RoutingError::ExchangeAlreadyDeclared(id));
        }
        let index = match kind {
            ExchangeKind::Direct => Index::Direct(HashMap::new()),
            ExchangeKind::Fanout => Index::Fanout,
            ExchangeKind::Topic => Index::Topic(TopicTrie::default()),
            ExchangeKind::Headers => Index::Headers(HeadersIndex::default()),
        };
        self.exchanges[slot] = Some(Exchange {
            kind,
            alternate: None,
            alternate_for: HashSet::new(),
            as_source: Vec::new(),
            as_destination: Vec::new(),
            index,
        });
        self.exchange_count += 1;
        Ok(())
    }

    /// Removes an exchange with its bindings as source and as destination, in O(those
    /// bindings). Returns the other exchanges left with no binding as source, which the broker
    /// deletes in turn if they are auto-delete.
    ///
    /// Exchanges that had this one as their alternate lose it, so that a reused id never
    /// inherits the role. RabbitMQ names an alternate, and a new exchange of that name
    /// takes it up again: the broker, which keeps the names, calls
    /// [`RoutingTable::set_alternate_exchange`] again when it declares one.
    pub fn delete_exchange(&mut self, id: ExchangeId) -> Result<Vec<ExchangeId>, RoutingError> {
        let Some(exchange) = self.exchange_mut(id) else {
            return Err(RoutingError::ExchangeNotFound(id));
        };
        let referrers = std::mem::take(&mut exchange.alternate_for);
        let own_alternate = exchange.alternate.take();
        for referrer in referrers {
            if let Some(r) = self.exchange_mut(referrer) {
                r.alternate = None;
            }
        }
        if let Some(alternate) = own_alternate.and_then(|a| self.exchange_mut(a)) {
            alternate.alternate_for.remove(&id);
        }
        while let Some(&binding) = self.exchange(id).and_then(|x| x.as_source.last()) {
            self.remove_binding(binding);
        }
        let mut unused = Vec::new();
        while let Some(&binding) = self.exchange(id).and_then(|x| x.as_destination.last()) {
            let source = self.binding(binding).source;
            if self.remove_binding(binding) && source != id {
                unused.push(source);
            }
        }
        self.exchanges[id.0 as usize] = None;
        self.exchange_count -= 1;
        Ok(unused)
    }

    /// Sets or clears the exchange that takes the messages `id` routes to nothing. Both must
    /// exist: RabbitMQ accepts the name of an exchange not declared yet, so the broker keeps
    /// the name and sets the id once that exchange is declared (and again if it is deleted
    /// and declared anew, since deletion clears it here).
    pub fn set_alternate_exchange(
        &mut self,
        id: ExchangeId,
        alternate: Option<ExchangeId>,
    ) -> Result<(), RoutingError> {
        if self.exchange(id).is_none() {
            return Err(RoutingError::ExchangeNotFound(id));
        }
        if let Some(new) = alternate {
            self.exchange_mut(new)
                .ok_or(RoutingError::ExchangeNotFound(new))?
                .alternate_for
                .insert(id);
        }
        let exchange = self.exchange_mut(id).expect("checked above");
        let old = std::mem::replace(&mut exchange.alternate, alternate);
        if let Some(old) = old.filter(|&old| Some(old) != alternate) {
            if let Some(old) = self.exchange_mut(old) {
                old.alternate_for.remove(&id);
            }
        }
        Ok(())
    }

    pub fn alternate_exchange(&self, id: ExchangeId) -> Option<ExchangeId> {
        self.exchange(id)?.alternate
    }

    /// Checks the ids a binding names: the source exchange, and the destination exchange if
    /// it is one (queues are the broker's to check: it knows their names).
    fn check_binding_ends(
        &self,
        source: ExchangeId,
        destination: Destination,
    ) -> Result<&Exchange, RoutingError> {
        let exchange = self
            .exchange(source)
            .ok_or(RoutingError::ExchangeNotFound(source))?;
        match destination {
            Destination::Queue(q) => {
                check_id(q.0)?;
            }
            Destination::Exchange(x) => {
                if self.exchange(x).is_none() {
                    return Err(RoutingError::ExchangeNotFound(x));
                }
            }
        }
        Ok(exchange)
    }

    /// Adds a binding. Returns false, changing nothing, if the same (source, destination, key,
    /// arguments) is already bound. A headers binding's arguments are validated first.
    pub fn bind(
        &mut self,
        source: ExchangeId,
        destination: Destination,
        key: &[u8],
        args: &FieldTable,
    ) -> Result<bool, RoutingError> {
        if key.len() > KEY_BYTES_MAX {
            return Err(RoutingError::KeyTooLong { bytes: key.len() });
        }
        let kind = self.check_binding_ends(source, destination)?.kind;
        let headers = match kind {
            ExchangeKind::Headers => Some(Box::new(HeadersMatch::parse(args)?)),
            _ => None,
        };
        identity::encode(
            source,
            destination,
            key,
            args.inner().iter(),
            &mut self.identity,
        );
        if self.identities.contains_key(self.identity.as_slice()) {
            return Ok(false);
        }

        let id = match self.bindings_free.pop() {
            Some(free) => BindingId(free),
            None => {
                self.bindings.push(None);
                BindingId(position(self.bindings.len() - 1))
            }
        };
        self.identities.insert(self.identity.as_slice().into(), id);

        let destination_list = match destination {
            Destination::Queue(q) => {
                let slot = q.0 as usize;
                self.queue_slots = self.queue_slots.max(slot + 1);
                self.queue_bindings.entry(q).or_default()
            }
            Destination::Exchange(x) => {
                &mut self.exchange_mut(x).expect("checked above").as_destination
            }
        };
        let destination_position = position(destination_list.len());
        destination_list.push(id);

        let exchange = self.exchange_mut(source).expect("checked above");
        let source_position = position(exchange.as_source.len());
        exchange.as_source.push(id);
        let slot = match &mut exchange.index {
            Index::Direct(keys) => {
                // Look up before inserting: `entry` would copy the key even when it is bound.
                let list = match keys.get_mut(key) {
                    Some(list) => list,
                    None => keys.entry(key.into()).or_default(),
                };
                list.push(id);
                IndexSlot::Direct {
                    position: position(list.len() - 1),
                }
            }
            Index::Topic(trie) => {
                let (node, position) = trie.insert(key, id);
                IndexSlot::Topic { node, position }
            }
            Index::Headers(index) => {
                let matcher = headers
                    .as_ref()
                    .expect("parsed above for headers exchanges");
                IndexSlot::Headers(index.insert(id, matcher).into_boxed_slice())
            }
            Index::Fanout => IndexSlot::SourceList,
        };

        self.bindings[id.0 as usize] = Some(Binding {
            source,
            destination,
            key: key.into(),
            args: args
                .inner()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            source_position,
            destination_position,
            slot,
            headers,
        });
        self.binding_count += 1;
        Ok(true)
    }

    /// Removes a binding if it exists; see [`Unbound`]. A missing binding is not an error
    /// (RabbitMQ answers unbind-ok); a missing source or destination exchange is.
    pub fn unbind(
        &mut self,
        source: ExchangeId,
        destination: Destination,
        key: &[u8],
        args: &FieldTable,
    ) -> Result<Unbound, RoutingError> {
        self.check_binding_ends(source, destination)?;
        identity::encode(
            source,
            destination,
            key,
            args.inner().iter(),
            &mut self.identity,
        );
        match self.identities.get(self.identity.as_slice()).copied() {
            None => Ok(Unbound {
                existed: false,
                source_unused: false,
            }),
            Some(binding) => Ok(Unbound {
                existed: true,
                source_unused: self.remove_binding(binding),
            }),
        }
    }

    /// Removes every binding *to* `destination` (a deleted queue, or an exchange that stays),
    /// in O(those bindings). Returns the source exchanges left with no binding as source.
    /// To delete an exchange use [`RoutingTable::delete_exchange`], which also removes its
    /// bindings as source.
    pub fn remove_destination(
        &mut self,
        destination: Destination,
    ) -> Result<Vec<ExchangeId>, RoutingError> {
        let mut unused = Vec::new();
        loop {
            let last = match destination {
                Destination::Queue(q) => self.queue_bindings.get(&q).and_then(|l| l.last()),
                Destination::Exchange(x) => self
                    .exchange(x)
                    .ok_or(RoutingError::ExchangeNotFound(x))?
                    .as_destination
                    .last(),
            };
            let Some(&binding) = last else { break };
            let source = self.binding(binding).source;
            if self.remove_binding(binding) {
                unused.push(source);
            }
        }
        Ok(unused)
    }

    /// Unlinks a binding from its identity, source list, destination list and routing index,
    /// each in O(1) by swap-remove. Returns true if the source has no binding as source left.
    fn remove_binding(&mut self, id: BindingId) -> bool {
        let binding = self.bindings[id.0 as usize]
            .take()
            .expect("removing a live binding");
        self.bindings_free.push(id.0);
        self.binding_count -= 1;

        identity::encode(
            binding.source,
            binding.destination,
            &binding.key,
            binding.args.iter().map(|(k, v)| (k, v)),
            &mut self.identity,
        );
        let removed = self.identities.remove(self.identity.as_slice());
        debug_assert_eq!(removed, Some(id));

        // Destination list.
        let destination_list = match binding.destination {
            Destination::Queue(q) => self
                .queue_bindings
                .get_mut(&q)
                .expect("a bound queue has a list"),
            Destination::Exchange(x) => {
                &mut self
                    .exchange_mut(x)
                    .expect("a destination exchange outlives its bindings")
                    .as_destination
            }
        };
        let moved = swap_remove(destination_list, binding.destination_position, id);
        let queue_list_empty = destination_list.is_empty();
        if let Some(moved) = moved {
            self.binding_mut(moved).destination_position = binding.destination_position;
        }
        if let (Destination::Queue(q), true) = (binding.destination, queue_list_empty) {
            self.queue_bindings.remove(&q);
        }

        // Source list and routing index.
        let exchange = self
            .exchange_mut(binding.source)
            .expect("a source exchange outlives its bindings");
        let moved_source = swap_remove(&mut exchange.as_source, binding.source_position, id);
        let source_unused = exchange.as_source.is_empty();
        let mut moved_anchors = Vec::new();
        let moved_index = match (&mut exchange.index, &binding.slot) {
            (Index::Direct(keys), IndexSlot::Direct { position }) => {
                let list = keys.get_mut(&binding.key).expect("a bound key has a list");
                let moved = swap_remove(list, *position, id);
                if list.is_empty() {
                    keys.remove(&binding.key);
                }
                moved.map(|m| (m, *position))
            }
            (Index::Topic(trie), IndexSlot::Topic { node, position }) => {
                trie.remove(*node, *position).map(|m| (m, *position))
            }
            (Index::Headers(index), IndexSlot::Headers(anchors)) => {
                let mut anchors = anchors.to_vec();
                for i in 0..anchors.len() {
                    let Some((moved, from)) = index.remove(anchors[i], id) else {
                        continue;
                    };
                    let (list, to) = (anchors[i].list, anchors[i].position);
                    if moved == id {
                        // Two of this binding's own anchors share a list (a fingerprint
                        // collision): the later one moved.
                        let own = anchors
                            .iter_mut()
                            .find(|a| a.list == list && a.position == from);
                        own.expect("the moved anchor is one of ours").position = to;
                    } else {
                        moved_anchors.push((moved, list, from, to));
                    }
                }
                None
            }
            (Index::Fanout, IndexSlot::SourceList) => None,
            _ => unreachable!("a binding's slot matches its source's kind"),
        };
        if let Some(moved) = moved_source {
            self.binding_mut(moved).source_position = binding.source_position;
        }
        if let Some((moved, new_position)) = moved_index {
            match &mut self.binding_mut(moved).slot {
                IndexSlot::Direct { position } | IndexSlot::Topic { position, .. } => {
                    *position = new_position;
                }
                IndexSlot::Headers(_) | IndexSlot::SourceList => {
                    unreachable!("only direct and topic report a single moved binding")
                }
            }
        }
        for (moved, list, from, to) in moved_anchors {
            let IndexSlot::Headers(anchors) = &mut self.binding_mut(moved).slot else {
                unreachable!("headers lists hold headers bindings")
            };
            let anchor = anchors
                .iter_mut()
                .find(|a| a.list == list && a.position == from);
            anchor
                .expect("the moved binding has an anchor there")
                .position = to;
        }
        source_unused
    }

    /// Whether a binding with exactly this (source, destination, key, arguments) exists.
    /// Control plane: builds its lookup key in a fresh buffer so it can take `&self`.
    pub fn binding_exists(
        &self,
        source: ExchangeId,
        destination: Destination,
        key: &[u8],
        args: &FieldTable,
    ) -> bool {
        let mut identity = Vec::new();
        identity::encode(source, destination, key, args.inner().iter(), &mut identity);
        self.identities.contains_key(identity.as_slice())
    }

    /// For `exchange.delete` with `if-unused`, and auto-delete.
    pub fn has_bindings_as_source(&self, id: ExchangeId) -> bool {
        self.exchange(id).is_some_and(|x| !x.as_source.is_empty())
    }

    pub fn has_bindings_as_destination(&self, destination: Destination) -> bool {
        self.destination_binding_count(destination) > 0
    }

    pub fn source_binding_count(&self, id: ExchangeId) -> usize {
        self.exchange(id).map_or(0, |x| x.as_source.len())
    }

    pub fn destination_binding_count(&self, destination: Destination) -> usize {
        match destination {
            Destination::Queue(q) => self.queue_bindings.get(&q).map_or(0, Vec::len),
            Destination::Exchange(x) => self.exchange(x).map_or(0, |x| x.as_destination.len()),
        }
    }

    fn info(&self, id: BindingId) -> BindingInfo<'_> {
        let b = self.binding(id);
        BindingInfo {
            source: b.source,
            destination: b.destination,
            key: &b.key,
            args: &b.args,
        }
    }

    /// Bindings whose source is `id`, in no particular order; none if it does not exist.
    pub fn bindings_of_source(&self, id: ExchangeId) -> impl Iterator<Item = BindingInfo<'_>> {
        self.exchange(id)
            .map_or(&[][..], |x| x.as_source.as_slice())
            .iter()
            .map(|&b| self.info(b))
    }

    /// Bindings to `destination`, in no particular order.
    pub fn bindings_of_destination(
        &self,
        destination: Destination,
    ) -> impl Iterator<Item = BindingInfo<'_>> {
        let list = match destination {
            Destination::Queue(q) => self.queue_bindings.get(&q).map(Vec::as_slice),
            Destination::Exchange(x) => self.exchange(x).map(|x| x.as_destination.as_slice()),
        };
        list.unwrap_or(&[]).iter().map(|&b| self.info(b))
    }

    /// Every binding of the vhost, in no particular order.
    pub fn bindings(&self) -> impl Iterator<Item = BindingInfo<'_>> {
        self.bindings.iter().flatten().map(|b| BindingInfo {
            source: b.source,
            destination: b.destination,
            key: &b.key,
            args: &b.args,
        })
    }

    /// Appends to `out` each queue the message reaches, once, following exchange-to-exchange
    /// bindings and alternate exchanges with every exchange visited at most once. `out` is
    /// not cleared: queues already in it are not considered. Allocates only to grow `out`
    /// and, the first time the table has grown, the table's own [`RouteScratch`].
    pub fn route(
        &mut self,
        exchange: ExchangeId,
        routing_key: &[u8],
        headers: Option<&FieldTable>,
        out: &mut Vec<QueueId>,
    ) -> Result<(), RoutingError> {
        route_through(
            &self.exchanges,
            &self.bindings,
            self.queue_slots,
            &mut self.route_scratch,
            exchange,
            &[routing_key],
            headers,
            out,
        )
    }

    /// [`RoutingTable::route`] with the caller's scratch, so that threads can route at once
    /// through a shared reference.
    pub fn route_with(
        &self,
        scratch: &mut RouteScratch,
        exchange: ExchangeId,
        routing_key: &[u8],
        headers: Option<&FieldTable>,
        out: &mut Vec<QueueId>,
    ) -> Result<(), RoutingError> {
        route_through(
            &self.exchanges,
            &self.bindings,
            self.queue_slots,
            scratch,
            exchange,
            &[routing_key],
            headers,
            out,
        )
    }

    /// [`RoutingTable::route_keys_with`] with the table's own scratch.
    pub fn route_keys<K: AsRef<[u8]>>(
        &mut self,
        exchange: ExchangeId,
        routing_keys: &[K],
        headers: Option<&FieldTable>,
        out: &mut Vec<QueueId>,
    ) -> Result<(), RoutingError> {
        route_through(
            &self.exchanges,
            &self.bindings,
            self.queue_slots,
            &mut self.route_scratch,
            exchange,
            routing_keys,
            headers,
            out,
        )
    }

    /// Routes a message published with several routing keys (any `AsRef<[u8]>`: `&[u8]`,
    /// `Bytes`, `String`): its own plus those of its `CC` and `BCC` headers (RabbitMQ's sender-selected distribution). As in RabbitMQ this is one
    /// walk, not one per key: each exchange is visited once and matches a binding if any key
    /// does, each queue is returned once, and an exchange goes to its alternate only if no
    /// key matched any of its bindings.
    pub fn route_keys_with<K: AsRef<[u8]>>(
        &self,
        scratch: &mut RouteScratch,
        exchange: ExchangeId,
        routing_keys: &[K],
        headers: Option<&FieldTable>,
        out: &mut Vec<QueueId>,
    ) -> Result<(), RoutingError> {
        route_through(
            &self.exchanges,
            &self.bindings,
            self.queue_slots,
            scratch,
            exchange,
            routing_keys,
            headers,
            out,
        )
    }

    /// Checks every back-pointer (positions, identities, counts) against the lists: the
    /// property tests call it after each command.
    #[cfg(test)]
    fn assert_consistent(&self) {
        let mut live = 0;
        for (index, binding) in self.bindings.iter().enumerate() {
            let Some(b) = binding else { continue };
            live += 1;
            let id = BindingId(position(index));
            let source = self.exchange(b.source).expect("source exists");
            assert_eq!(source.as_source[b.source_position as usize], id);
            let destination_list = match b.destination {
                Destination::Queue(q) => &self.queue_bindings[&q],
                Destination::Exchange(x) => &self.exchange(x).expect("dest").as_destination,
            };
            assert_eq!(destination_list[b.destination_position as usize], id);
            match (&source.index, &b.slot) {
                (Index::Direct(keys), IndexSlot::Direct { position }) => {
                    assert_eq!(keys[&b.key][*position as usize], id);
                }
                (Index::Topic(trie), IndexSlot::Topic { node, position }) => {
                    assert_eq!(trie.binding_at(*node, *position), Some(id));
                }
                (Index::Headers(index), IndexSlot::Headers(anchors)) => {
                    for anchor in anchors.iter() {
                        let list = match anchor.list {
                            headers::AnchorList::Always => &index.always,
                            headers::AnchorList::Keyed(f) => &index.keyed[&f],
                        };
                        assert_eq!(list[anchor.position as usize], id);
                    }
                }
                (Index::Fanout, IndexSlot::SourceList) => {}
                _ => panic!("slot does not match the exchange kind"),
            }
            let mut identity = Vec::new();
            let args = b.args.iter().map(|(k, v)| (k, v));
            identity::encode(b.source, b.destination, &b.key, args, &mut identity);
            assert_eq!(self.identities.get(identity.as_slice()), Some(&id));
        }
        assert_eq!(live, self.binding_count);
        assert_eq!(self.identities.len(), self.binding_count);
        let listed: usize = self
            .exchanges
            .iter()
            .flatten()
            .map(|x| x.as_source.len())
            .sum();
        assert_eq!(listed, self.binding_count);
        assert!(self.queue_bindings.values().all(|l| !l.is_empty()));
        for (index, exchange) in self.exchanges.iter().enumerate() {
            let Some(exchange) = exchange else { continue };
            let id = ExchangeId(position(index));
            if let Some(alternate) = exchange.alternate {
                let alternate = self.exchange(alternate).expect("alternates exist");
                assert!(alternate.alternate_for.contains(&id));
            }
            for &referrer in &exchange.alternate_for {
                assert_eq!(self.alternate_exchange(referrer), Some(id));
            }
        }
    }
}

/// Swap-removes `list[position]` (which must be `id`) and returns the element that moved
/// into `position`, whose stored position the caller updates.
fn swap_remove(list: &mut Vec<BindingId>, position: u32, id: BindingId) -> Option<BindingId> {
    let removed = list.swap_remove(position as usize);
    assert_eq!(removed, id, "binding back-pointer out of date");
    list.get(position as usize).copied()
}

/// The route walk itself, over the table's parts, so that [`RoutingTable::route`] can lend
/// the table's own scratch mutably while the rest is read.
#[allow(clippy::too_many_arguments)]
fn route_through<K: AsRef<[u8]>>(
    exchanges: &[Option<Exchange>],
    bindings: &[Option<Binding>],
    queue_slots: usize,
    scratch: &mut RouteScratch,
    exchange: ExchangeId,
    routing_keys: &[K],
    headers: Option<&FieldTable>,
    out: &mut Vec<QueueId>,
) -> Result<(), RoutingError> {
    if !exchanges
        .get(exchange.0 as usize)
        .is_some_and(Option::is_some)
    {
        return Err(RoutingError::ExchangeNotFound(exchange));
    }
    scratch.fit(exchanges.len(), queue_slots, bindings.len());
    let epoch = scratch.next_epoch();
    let RouteScratch {
        exchange_marks,
        queue_marks,
        binding_marks,
        work,
        topic: topic_scratch,
        ..
    } = scratch;
    work.clear();
    exchange_marks[exchange.0 as usize] = epoch;
    work.push(exchange);

    while let Some(current) = work.pop() {
        let source = exchanges[current.0 as usize]
            .as_ref()
            .expect("only existing exchanges join the work list");
        let mut matched = false;
        let mut deliver = |id: BindingId| {
            matched = true;
            let binding = bindings[id.0 as usize]
                .as_ref()
                .expect("indexed bindings are live");
            match binding.destination {
                Destination::Queue(q) => {
                    let mark = &mut queue_marks[q.0 as usize];
                    if *mark != epoch {
                        *mark = epoch;
                        out.push(q);
                    }
                }
                Destination::Exchange(x) => {
                    let mark = &mut exchange_marks[x.0 as usize];
                    if *mark != epoch {
                        *mark = epoch;
                        work.push(x);
                    }
                }
            }
        };
        match &source.index {
            Index::Direct(keys) => {
                for routing_key in routing_keys {
                    if let Some(list) = keys.get(routing_key.as_ref()) {
                        list.iter().for_each(|&b| deliver(b));
                    }
                }
            }
            Index::Fanout => source.as_source.iter().for_each(|&b| deliver(b)),
            Index::Topic(trie) => {
                for routing_key in routing_keys {
                    trie.matches(routing_key.as_ref(), topic_scratch, &mut deliver);
                }
            }
            Index::Headers(index) => {
                index.always.iter().for_each(|&b| deliver(b));
                for (key, value) in headers.into_iter().flatten() {
                    let key = key.as_str();
                    let fingerprints = [
                        index.value_fingerprint(key, value),
                        index.key_fingerprint(key),
                    ];
                    for fingerprint in fingerprints {
                        let Some(candidates) = index.keyed.get(&fingerprint) else {
                            continue;
                        };
                        for &b in candidates {
                            let mark = &mut binding_marks[b.0 as usize];
                            if *mark == epoch {
                                continue;
                            }
                            *mark = epoch;
                            let matcher = bindings[b.0 as usize]
                                .as_ref()
                                .and_then(|binding| binding.headers.as_ref())
                                .expect("headers bindings are live and carry a matcher");
                            if matcher.matches(headers) {
                                deliver(b);
                            }
                        }
                    }
                }
            }
        }
        let alternate = source.alternate;
        if !matched {
            if let Some(alternate) = alternate {
                let exists = exchanges
                    .get(alternate.0 as usize)
                    .is_some_and(Option::is_some);
                if exists && exchange_marks[alternate.0 as usize] != epoch {
                    exchange_marks[alternate.0 as usize] = epoch;
                    work.push(alternate);
                }
            }
        }
    }
    Ok(())
}
