//! How much of the hierarchy one record moves, by the sequential reference: grows layer 0 from a records file (turn
//! records with `conversation`, `turn`, `seq`, `speaker`, `text`, as `scripts/to_records.py` writes them) with the
//! hash embedder and the exact similarity index, builds every layer from scratch at `n` records and after each of the
//! next `k`, and prints per layer the cluster-membership rows that changed and the nodes, edges and weights of its
//! graph that changed. The engine's own measure of the same is `engram bench scale`'s `view_updates_per_record`;
//! this one shows where along the layers a change grows, without the dataflow.
//!
//! `cargo run --release -p engram-operators --example churn -- FILE N K [LPA_LAYERS] [MAX_CLUSTER_SIZE] [MAX_DEGREE] [REPLICA_LAYERS]`

use std::collections::BTreeSet;

use engram_operators::embed::{Embedder, HashEmbedder};
use engram_operators::hierarchy::reference::{cluster_layer, next_layer, Clusters, Graph};
use engram_operators::hierarchy::HierarchyParams;
use engram_operators::model::{Node, NodeKind, POSITION_SCALE};
use engram_operators::similarity::{SimilarityIndex, SimilarityParams};

type Rows = BTreeSet<(String, String)>;

fn rows(layers: &[Clusters]) -> Vec<Rows> {
    layers
        .iter()
        .map(|cs| cs.iter().flat_map(|(c, ms)| ms.iter().map(move |m| (c.clone(), m.clone()))).collect())
        .collect()
}

/// Every layer's clusters and every layer's graph (index 0: layer 0), as `reference::build` makes them.
fn layers(g: &Graph, p: &HierarchyParams) -> (Vec<Clusters>, Vec<Graph>) {
    let (mut clusters, mut graphs) = (Vec::new(), vec![g.clone()]);
    for layer in 1..=p.max_layers as u32 {
        let below = graphs.last().expect("layer 0");
        let c = cluster_layer(layer, below, p);
        let next = next_layer(below, &c, p.max_degree);
        if !p.keeps(below.nodes.len(), next.nodes.len()) {
            break;
        }
        clusters.push(c);
        graphs.push(next);
    }
    (clusters, graphs)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: churn FILE N K [LPA_LAYERS] [MAX_CLUSTER_SIZE] [MAX_DEGREE] [REPLICA_LAYERS]";
    let (Some(path), Some(n), Some(k)) = (args.get(1), args.get(2), args.get(3)) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let num = |s: &str| -> usize { s.parse().unwrap_or_else(|_| panic!("{usage}: `{s}` is not a number")) };
    let (n, k) = (num(n), num(k));
    let d = HierarchyParams::default();
    let p = HierarchyParams {
        lpa_layers: args.get(4).map_or(d.lpa_layers, |s| num(s)),
        max_cluster_size: args.get(5).map_or(d.max_cluster_size, |s| num(s)),
        max_degree: args.get(6).map_or(d.max_degree, |s| num(s)),
        replica_layers: args.get(7).map_or(d.replica_layers, |s| num(s)),
        ..d
    };
    let text = std::fs::read_to_string(path).expect("the records file");
    let embedder = HashEmbedder::new(1024);
    let mut index = SimilarityIndex::new(SimilarityParams { theta: 0.1, ..SimilarityParams::default() });
    let mut nodes = BTreeSet::new();
    let mut prev: Option<(Vec<Rows>, Vec<Graph>)> = None;
    let mut total = vec![0.0; p.max_layers];
    // Per layer (index 0: layer 0), the graph's nodes and edges that changed, summed over the records.
    let mut graph_total = vec![(0usize, 0usize); p.max_layers + 1];
    for (i, line) in text.lines().take(n + k).enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON record");
        let field = |f: &str| v[f].as_str().unwrap_or_default().to_string();
        let node = Node {
            id: format!("{}#{}", field("conversation"), field("turn")).into(),
            kind: NodeKind::Turn,
            doc: field("conversation").into(),
            pos: v["seq"].as_i64().unwrap_or(i as i64) * POSITION_SCALE,
            text: field("text").into(),
            speaker: v["speaker"].as_str().map(Into::into),
            ts: None,
        };
        nodes.insert(node.id.to_string());
        let e = embedder.embed(&node.text);
        index.apply(vec![(node, e, 1)]);
        if i + 1 < n {
            continue;
        }
        let g = Graph {
            nodes: nodes.clone(),
            edges: index.edges().into_iter().map(|(u, v, w)| ((u, v), u64::from(w))).collect(),
        };
        let (clusters, graphs) = layers(&g, &p);
        let now = rows(&clusters);
        match &prev {
            None => {
                println!("layers {:?}", graphs.iter().map(|g| g.nodes.len()).collect::<Vec<_>>());
                println!("edges {:?}", graphs.iter().map(|g| g.edges.len()).collect::<Vec<_>>());
            }
            Some((before, before_graphs)) => {
                let changed: Vec<usize> = (0..now.len().max(before.len()))
                    .map(|l| {
                        let (a, b) =
                            (now.get(l).cloned().unwrap_or_default(), before.get(l).cloned().unwrap_or_default());
                        a.symmetric_difference(&b).count()
                    })
                    .collect();
                for (l, c) in changed.iter().enumerate().take(total.len()) {
                    total[l] += *c as f64;
                }
                let graph_changes: Vec<(usize, usize, usize)> = graphs
                    .iter()
                    .zip(before_graphs)
                    .map(|(a, b)| {
                        let (ea, eb): (BTreeSet<_>, BTreeSet<_>) = (a.edges.keys().collect(), b.edges.keys().collect());
                        let weights = a.edges.iter().filter(|(e, w)| b.edges.get(*e).is_some_and(|x| x != *w)).count();
                        (a.nodes.symmetric_difference(&b.nodes).count(), ea.symmetric_difference(&eb).count(), weights)
                    })
                    .collect();
                for (t, (n, e, _)) in graph_total.iter_mut().zip(&graph_changes) {
                    *t = (t.0 + n, t.1 + e);
                }
                println!("record {}: cluster rows changed by layer {changed:?}", i + 1);
                println!("  graph changes by layer (nodes, edges, weights) {graph_changes:?}");
            }
        }
        prev = Some((now, graphs));
    }
    let mean: Vec<String> = total.iter().map(|t| format!("{:.1}", t / k.max(1) as f64)).collect();
    println!("mean cluster rows changed per record, layers 1..: {}", mean.join(" "));
    let per = |x: usize| x as f64 / k.max(1) as f64;
    let graph: Vec<String> = graph_total.iter().map(|(n, e)| format!("{:.1}/{:.1}", per(*n), per(*e))).collect();
    println!("mean graph nodes/edges changed per record, layers 0..: {}", graph.join(" "));
}
