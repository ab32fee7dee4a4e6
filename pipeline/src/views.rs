//! Materialised, read-optimised views of the dataflow's output, per space, which the HTTP server reads while the
//! dataflow runs. Each reflects a whole number of epochs: `as_of` is the last epoch fully applied.

use std::collections::{BTreeMap, HashMap, VecDeque};

use operators::model::ErrorRow;
use operators::{Edge, Embedding, Node};
use serde::{Deserialize, Serialize};

/// One change to the views, as the dataflow emits it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ViewUpdate {
    Node(String, Node, Embedding),
    Edge(Edge),
    Error(ErrorRow),
}

#[derive(Default)]
pub struct SpaceView {
    pub nodes: HashMap<String, (Node, Embedding)>,
    pub adjacency: HashMap<String, BTreeMap<String, u32>>,
    pub edges: usize,
}

/// How many recent rejects the views keep for `GET /v1/errors`.
const RECENT_ERRORS: usize = 100;

#[derive(Default)]
pub struct Views {
    /// The last epoch whose every update is applied; `None` before the first.
    pub as_of: Option<u64>,
    pub spaces: BTreeMap<String, SpaceView>,
    pub errors_total: u64,
    pub recent_errors: VecDeque<ErrorRow>,
}

impl Views {
    /// Applies the updates of one epoch: retractions before insertions, so that a replaced node ends up replaced.
    pub fn apply(&mut self, mut updates: Vec<(ViewUpdate, isize)>) {
        updates.sort_by_key(|u| u.1);
        for (u, d) in updates {
            match u {
                ViewUpdate::Node(space, node, emb) => {
                    let view = self.spaces.entry(space.clone()).or_default();
                    if d > 0 {
                        view.nodes.insert(node.id.clone(), (node, emb));
                    } else if view.nodes.get(&node.id).is_some_and(|(n, _)| *n == node) {
                        view.nodes.remove(&node.id);
                    }
                }
                ViewUpdate::Edge(e) => {
                    let view = self.spaces.entry(e.space.clone()).or_default();
                    if d > 0 {
                        view.adjacency.entry(e.u.clone()).or_default().insert(e.v.clone(), e.weight_micro);
                        view.adjacency.entry(e.v.clone()).or_default().insert(e.u.clone(), e.weight_micro);
                        view.edges += 1;
                    } else {
                        let mut removed = false;
                        for (a, b) in [(&e.u, &e.v), (&e.v, &e.u)] {
                            if let Some(m) = view.adjacency.get_mut(a) {
                                if m.get(b) == Some(&e.weight_micro) {
                                    m.remove(b);
                                    removed = true;
                                }
                                if m.is_empty() {
                                    view.adjacency.remove(a);
                                }
                            }
                        }
                        if removed {
                            view.edges -= 1;
                        }
                    }
                }
                ViewUpdate::Error(row) => {
                    if d > 0 {
                        self.errors_total += 1;
                        self.recent_errors.push_back(row);
                        while self.recent_errors.len() > RECENT_ERRORS {
                            self.recent_errors.pop_front();
                        }
                    }
                }
            }
        }
        self.spaces.retain(|_, v| !v.nodes.is_empty() || v.edges > 0);
    }

    pub fn node_count(&self) -> usize {
        self.spaces.values().map(|v| v.nodes.len()).sum()
    }

    pub fn edge_count(&self) -> usize {
        self.spaces.values().map(|v| v.edges).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use operators::NodeKind;

    fn node(id: &str, text: &str) -> Node {
        Node { id: id.into(), kind: NodeKind::Chunk, doc: "d".into(), pos: 0, text: text.into(), speaker: None, ts: None }
    }

    #[test]
    fn replacement_within_an_epoch_keeps_the_new_version() {
        let mut v = Views::default();
        v.apply(vec![(ViewUpdate::Node("s".into(), node("a", "old"), Embedding::default()), 1)]);
        v.apply(vec![
            (ViewUpdate::Node("s".into(), node("a", "new"), Embedding::default()), 1),
            (ViewUpdate::Node("s".into(), node("a", "old"), Embedding::default()), -1),
        ]);
        assert_eq!(v.spaces["s"].nodes["a"].0.text, "new");
        v.apply(vec![(ViewUpdate::Node("s".into(), node("a", "new"), Embedding::default()), -1)]);
        assert!(v.spaces.is_empty());
    }
}
