//! `engram bench theta`: calibration of θ for an embedder.

use std::process::ExitCode;

use operators::{Node, SimilarityParams};

use super::{config_embedder, load_nodes, BenchArgs};
use crate::config::Config;

/// Calibration of θ for an embedder: percentiles of the cosine between random pairs of different documents, of
/// each node's best cross-document cosine, and of the score of neighbouring chunks; then, for a range of θ, the
/// edges per node of the resulting graph (exact, brute force).
pub(super) fn theta(args: &BenchArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let deltas = load_nodes(args, config)?;
    let embedder = config_embedder(config)?;
    let live: Vec<(String, Node)> = deltas.into_iter().filter(|d| d.2 > 0).map(|(s, n, _)| (s, n)).collect();
    let texts: Vec<String> = live.iter().map(|(_, n)| n.embedding_text()).collect();
    let vectors = embedder.embed_batch(&texts.iter().map(String::as_str).collect::<Vec<_>>());
    let mut by_space: std::collections::BTreeMap<String, Vec<(Node, operators::Embedding)>> = Default::default();
    for ((s, n), e) in live.into_iter().zip(vectors) {
        by_space.entry(s).or_default().push((n, e));
    }
    let pct = |v: &mut Vec<f32>, p: f64| -> f32 {
        if v.is_empty() {
            return f32::NAN;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    let params = config.similarity.clone();
    for (space, nodes) in &by_space {
        let mut random = Vec::new();
        let mut best = Vec::new();
        let mut adjacent = Vec::new();
        let n = nodes.len();
        for (i, (a, ea)) in nodes.iter().enumerate() {
            let mut b_best = 0f32;
            for (j, (b, eb)) in nodes.iter().enumerate() {
                if i == j {
                    continue;
                }
                let cos = ea.dot(eb);
                if a.doc != b.doc {
                    b_best = b_best.max(cos);
                    if (i * 31 + j * 17) % 97 == 0 {
                        random.push(cos);
                    }
                } else if (a.pos - b.pos).abs() == operators::model::POSITION_SCALE && i < j {
                    adjacent.push(params.score((&a.doc, a.pos, ea), (&b.doc, b.pos, eb)));
                }
            }
            best.push(b_best);
        }
        let mut row = serde_json::json!({"bench": "theta", "space": space, "nodes": n});
        for (name, v) in
            [("random_cross_cos", &mut random), ("best_cross_cos", &mut best), ("adjacent_score", &mut adjacent)]
        {
            row[name] = serde_json::json!({"p10": pct(v, 0.1), "p50": pct(v, 0.5), "p90": pct(v, 0.9)});
        }
        let mut per_theta = serde_json::Map::new();
        for t in [0.1f32, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6] {
            let p = SimilarityParams { theta: t, ..params.clone() };
            let edges = operators::similarity::reference_edges(&p, nodes);
            let cross = edges
                .iter()
                .filter(|(u, v, _)| {
                    let du = nodes.iter().find(|x| &x.0.id == u).map(|x| &x.0.doc);
                    let dv = nodes.iter().find(|x| &x.0.id == v).map(|x| &x.0.doc);
                    du != dv
                })
                .count();
            per_theta.insert(format!("{t}"), serde_json::json!({"edges_per_node": edges.len() as f64 / n as f64, "cross_doc_share": cross as f64 / edges.len().max(1) as f64}));
        }
        row["by_theta"] = serde_json::Value::Object(per_theta);
        println!("{}", if args.json { row.to_string() } else { serde_json::to_string_pretty(&row)? });
    }
    Ok(ExitCode::SUCCESS)
}
