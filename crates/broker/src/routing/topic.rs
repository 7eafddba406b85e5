//! The topic exchange's trie: binding keys are paths of words, `*` and `#` are edges of their own.
//!
//! Matching runs the trie as an NFA: the set of live nodes advances one routing-key word at a
//! time, and a node is live at most once per word (marked with an epoch), so a routing key of
//! `w` words costs O(w x live nodes x 1 hash lookup) whatever the number of bindings, and
//! patterns like `#.#.#` cannot blow up exponentially as the naive recursive matcher does.
//!
//! Words follow RabbitMQ's `split_topic_key`: the empty key has zero words, otherwise the key is
//! split on every `.`, so `"."` is two empty words and `"a..b"` is `a`, ``, `b`.

use std::collections::HashMap;

use super::BindingId;

/// Marks a missing child or parent: node ids are indices into [`TopicTrie::nodes`].
const NODE_NONE: u32 = u32::MAX;
/// The root is allocated first and never freed.
const NODE_ROOT: u32 = 0;

/// The words of a topic key, as RabbitMQ splits them: zero words for the empty key.
pub(crate) fn words(key: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut split = key.split(|&b| b == b'.');
    if key.is_empty() {
        // `split` yields one empty word for an empty input; RabbitMQ yields none.
        split.next();
    }
    split
}

/// How a node hangs from its parent, kept so an emptied node can unlink itself.
#[derive(Debug, Clone)]
enum Edge {
    Root,
    Word(Box<[u8]>),
    Star,
    Hash,
}

#[derive(Debug)]
struct Node {
    parent: u32,
    edge: Edge,
    /// Literal-word children; boxed and absent on leaves, which most nodes are, so a leaf
    /// costs 8 bytes here instead of an empty map's 48 (the lint's advice would cost 48).
    #[allow(clippy::box_collection)]
    children: Option<Box<HashMap<Box<[u8]>, u32>>>,
    star: u32,
    hash: u32,
    /// Bindings whose key ends at this node; a binding stores its position here.
    bindings: Vec<BindingId>,
}

impl Node {
    fn new(parent: u32, edge: Edge) -> Node {
        Node {
            parent,
            edge,
            children: None,
            star: NODE_NONE,
            hash: NODE_NONE,
            bindings: Vec::new(),
        }
    }

    fn child(&self, word: &[u8]) -> u32 {
        let child = self.children.as_ref().and_then(|c| c.get(word));
        child.copied().unwrap_or(NODE_NONE)
    }

    fn is_hash(&self) -> bool {
        matches!(self.edge, Edge::Hash)
    }

    fn is_empty(&self) -> bool {
        self.children.is_none()
            && self.star == NODE_NONE
            && self.hash == NODE_NONE
            && self.bindings.is_empty()
    }
}

#[derive(Debug)]
pub(crate) struct TopicTrie {
    nodes: Vec<Node>,
    free: Vec<u32>,
}

impl Default for TopicTrie {
    fn default() -> Self {
        TopicTrie {
            nodes: vec![Node::new(NODE_NONE, Edge::Root)],
            free: Vec::new(),
        }
    }
}

/// What [`TopicTrie::matches`] writes while it runs, kept by the caller so that matching
/// takes `&TopicTrie` and allocates nothing once warm.
#[derive(Debug, Default)]
pub(crate) struct TopicScratch {
    epoch: u32,
    /// `node_marks[node] == epoch` when the node is already live after the current word.
    node_marks: Vec<u32>,
    /// Live nodes before and after a word.
    live: Vec<u32>,
    live_next: Vec<u32>,
}

impl TopicScratch {
    #[cfg(test)]
    pub(crate) fn set_epoch_for_test(&mut self, epoch: u32) {
        self.epoch = epoch;
    }

    /// A fresh mark value; on wrap-around every mark is cleared, which is safe at any step
    /// since node marks only mean something within one step.
    fn next_epoch(&mut self) -> u32 {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.node_marks.fill(0);
            self.epoch = 1;
        }
        self.epoch
    }

    /// Makes `node` live (in `live_next` if `next`, else `live`) for `epoch`, with the `#`
    /// children it reaches by matching zero words.
    fn make_live(&mut self, nodes: &[Node], next: bool, epoch: u32, mut node: u32) {
        let live = if next {
            &mut self.live_next
        } else {
            &mut self.live
        };
        while node != NODE_NONE && self.node_marks[node as usize] != epoch {
            self.node_marks[node as usize] = epoch;
            live.push(node);
            node = nodes[node as usize].hash;
        }
    }
}

impl TopicTrie {
    /// Number of nodes in use, the root included (for tests of pruning).
    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// The binding stored at `position` of `node`, to check back-pointers in tests.
    #[cfg(test)]
    pub(crate) fn binding_at(&self, node: u32, position: u32) -> Option<BindingId> {
        let node = self.nodes.get(node as usize)?;
        node.bindings.get(position as usize).copied()
    }

    fn alloc(&mut self, parent: u32, edge: Edge) -> u32 {
        let node = Node::new(parent, edge);
        if let Some(id) = self.free.pop() {
            self.nodes[id as usize] = node;
            id
        } else {
            let id = u32::try_from(self.nodes.len()).expect("topic trie node ids fit in u32");
            assert!(id != NODE_NONE);
            self.nodes.push(node);
            id
        }
    }

    /// Adds `binding` under `key`; returns (node, position in the node's list) for its removal.
    pub(crate) fn insert(&mut self, key: &[u8], binding: BindingId) -> (u32, u32) {
        let mut node = NODE_ROOT;
        for word in words(key) {
            let current = &self.nodes[node as usize];
            let next = match word {
                b"*" => current.star,
                b"#" => current.hash,
                _ => current.child(word),
            };
            node = if next != NODE_NONE {
                next
            } else {
                let edge = match word {
                    b"*" => Edge::Star,
                    b"#" => Edge::Hash,
                    _ => Edge::Word(word.into()),
                };
                let child = self.alloc(node, edge.clone());
                let parent = &mut self.nodes[node as usize];
                match edge {
                    Edge::Star => parent.star = child,
                    Edge::Hash => parent.hash = child,
                    Edge::Word(word) => {
                        parent.children.get_or_insert_default().insert(word, child);
                    }
                    Edge::Root => unreachable!("the root is never a child"),
                }
                child
            };
        }
        let bindings = &mut self.nodes[node as usize].bindings;
        let position = u32::try_from(bindings.len()).expect("bindings per node fit in u32");
        bindings.push(binding);
        (node, position)
    }

    /// Removes the binding at `position` of `node`. Returns the binding that moved into
    /// `position` (its stored position must be updated), then prunes emptied nodes upwards.
    pub(crate) fn remove(&mut self, node: u32, position: u32) -> Option<BindingId> {
        let bindings = &mut self.nodes[node as usize].bindings;
        bindings.swap_remove(position as usize);
        let moved = bindings.get(position as usize).copied();
        self.prune(node);
        moved
    }

    fn prune(&mut self, mut node: u32) {
        while node != NODE_ROOT && self.nodes[node as usize].is_empty() {
            let parent = self.nodes[node as usize].parent;
            let edge = std::mem::replace(&mut self.nodes[node as usize].edge, Edge::Root);
            let parent_node = &mut self.nodes[parent as usize];
            match edge {
                Edge::Star => parent_node.star = NODE_NONE,
                Edge::Hash => parent_node.hash = NODE_NONE,
                Edge::Word(word) => {
                    let children = parent_node
                        .children
                        .as_mut()
                        .expect("a word child is listed");
                    children.remove(&word);
                    if children.is_empty() {
                        parent_node.children = None;
                    }
                }
                Edge::Root => unreachable!("only the root has no parent edge"),
            }
            // Give back the emptied node's allocations: a freed slot costs only its struct.
            self.nodes[node as usize] = Node::new(NODE_NONE, Edge::Root);
            self.free.push(node);
            node = parent;
        }
    }

    /// Calls `found` with every binding whose key matches `routing_key`; each binding once.
    pub(crate) fn matches(
        &self,
        routing_key: &[u8],
        scratch: &mut TopicScratch,
        mut found: impl FnMut(BindingId),
    ) {
        if scratch.node_marks.len() < self.nodes.len() {
            scratch.node_marks.resize(self.nodes.len(), 0);
        }
        scratch.live.clear();
        let epoch = scratch.next_epoch();
        scratch.make_live(&self.nodes, false, epoch, NODE_ROOT);
        for word in words(routing_key) {
            if scratch.live.is_empty() {
                break;
            }
            let epoch = scratch.next_epoch();
            scratch.live_next.clear();
            for i in 0..scratch.live.len() {
                let node_id = scratch.live[i];
                let node = &self.nodes[node_id as usize];
                let child = node.child(word);
                scratch.make_live(&self.nodes, true, epoch, child);
                scratch.make_live(&self.nodes, true, epoch, node.star);
                if node.is_hash() {
                    // A `#` eats this word and stays where it is.
                    scratch.make_live(&self.nodes, true, epoch, node_id);
                }
            }
            std::mem::swap(&mut scratch.live, &mut scratch.live_next);
        }
        for &node_id in &scratch.live {
            for &binding in &self.nodes[node_id as usize].bindings {
                found(binding);
            }
        }
    }
}
