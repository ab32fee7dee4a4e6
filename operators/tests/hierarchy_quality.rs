//! Clustering quality against networkx on fixture graphs (operators/tests/fixtures/graphs, made once by
//! scripts/make_graph_fixtures.py): the modularity of our layer-1 clusters next to networkx's
//! `label_propagation_communities` and `asyn_lpa_communities`. Our clusters overlap, so each node is assigned to the
//! one of its clusters it is most strongly tied to before modularity is computed.

use std::collections::{BTreeMap, BTreeSet};

use engram_operators::hierarchy::reference::{cluster_layer, Graph};
use engram_operators::hierarchy::HierarchyParams;

struct Fixture {
    name: String,
    nodes: Vec<String>,
    edges: Vec<(String, String, f64)>,
    nx_lpa: f64,
    nx_asyn: f64,
}

fn fixtures() -> Vec<Fixture> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/graphs");
    let mut out = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    for p in paths.into_iter().filter(|p| p.extension().is_some_and(|e| e == "json")) {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        out.push(Fixture {
            name: v["name"].as_str().unwrap().to_string(),
            nodes: v["nodes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect(),
            edges: v["edges"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (e[0].as_str().unwrap().to_string(), e[1].as_str().unwrap().to_string(), e[2].as_f64().unwrap())
                })
                .collect(),
            nx_lpa: v["networkx_lpa"]["modularity"].as_f64().unwrap(),
            nx_asyn: v["networkx_asyn_lpa"]["modularity"].as_f64().unwrap(),
        });
    }
    out
}

/// Newman modularity of a partition of a weighted undirected graph.
fn modularity(edges: &[(String, String, f64)], part: &BTreeMap<String, String>) -> f64 {
    let m: f64 = edges.iter().map(|e| e.2).sum();
    let mut deg: BTreeMap<&str, f64> = BTreeMap::new();
    let mut inside: BTreeMap<&str, f64> = BTreeMap::new();
    for (u, v, w) in edges {
        *deg.entry(u).or_default() += w;
        *deg.entry(v).or_default() += w;
        if part[u] == part[v] {
            *inside.entry(&part[u]).or_default() += w;
        }
    }
    let mut tot: BTreeMap<&str, f64> = BTreeMap::new();
    for (n, d) in &deg {
        *tot.entry(&part[*n]).or_default() += d;
    }
    tot.iter().map(|(c, t)| inside.get(c).copied().unwrap_or(0.0) / m - (t / (2.0 * m)).powi(2)).sum()
}

#[test]
fn modularity_against_networkx_label_propagation() {
    let fixtures = fixtures();
    assert_eq!(fixtures.len(), 6, "fixture graphs missing");
    println!("{:<22} {:>8} {:>8} {:>8} {:>9} {:>9}", "graph", "ours", "nx_lpa", "nx_asyn", "clusters", "overlap");
    let mut ratio_sum = 0.0;
    for f in &fixtures {
        let g = Graph {
            nodes: f.nodes.iter().cloned().collect(),
            edges: f.edges.iter().map(|(u, v, w)| ((u.clone(), v.clone()), (w * 1e6).round() as u64)).collect(),
        };
        // No size cap: networkx does not split either.
        let p = HierarchyParams { max_cluster_size: usize::MAX, ..HierarchyParams::default() };
        let clusters = cluster_layer(1, &g, &p);
        let mut of: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (c, ms) in &clusters {
            for m in ms {
                of.entry(m).or_default().push(c);
            }
        }
        assert_eq!(of.len(), f.nodes.len(), "every node is in a cluster");
        let overlap = of.values().filter(|cs| cs.len() > 1).count();
        // A node in several clusters goes to the one holding most of its edge weight (ties: smallest id).
        let mut part: BTreeMap<String, String> = BTreeMap::new();
        for (n, cs) in &of {
            let tie = |c: &str| -> f64 {
                f.edges
                    .iter()
                    .filter(|(u, v, _)| u == n || v == n)
                    .filter(|(u, v, _)| clusters[c].contains(if u == n { v } else { u }))
                    .map(|e| e.2)
                    .sum()
            };
            let best = cs.iter().copied().max_by(|a, b| tie(a).total_cmp(&tie(b)).then_with(|| b.cmp(a))).unwrap();
            part.insert(n.to_string(), best.to_string());
        }
        let q = modularity(&f.edges, &part);
        let distinct: BTreeSet<&String> = part.values().collect();
        println!("{:<22} {:>8.4} {:>8.4} {:>8.4} {:>9} {:>9}", f.name, q, f.nx_lpa, f.nx_asyn, distinct.len(), overlap);
        assert!(q > 0.0, "{}: clusters no better than chance ({q})", f.name);
        ratio_sum += q / f.nx_lpa;
    }
    let mean_ratio = ratio_sum / fixtures.len() as f64;
    println!("mean modularity ratio ours / networkx LPA: {mean_ratio:.3}");
    assert!(mean_ratio > 0.8, "clustering quality fell well below networkx's LPA: {mean_ratio:.3}");
}
