//! `engram bench embed`: embeddings per second.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use operators::{Embedder, HashEmbedder};

use super::{load_nodes, BenchArgs};
use crate::config::Config;

pub(super) fn embed_bench(args: &BenchArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let texts: Vec<String> =
        load_nodes(args, config)?.into_iter().filter(|d| d.2 > 0).map(|d| d.1.embedding_text()).collect();
    anyhow::ensure!(!texts.is_empty(), "no chunks in the inputs");
    let words = texts.iter().map(|t| t.split_whitespace().count()).sum::<usize>() as f64 / texts.len() as f64;
    #[cfg_attr(not(feature = "local-embedder"), allow(unused_mut))]
    let mut embedders: Vec<(&str, usize, Arc<dyn Embedder>)> =
        vec![("hash", 0, Arc::new(HashEmbedder::new(config.embedder.dim)))];
    #[cfg(feature = "local-embedder")]
    if let Some(dir) = &args.model_dir {
        for batch in [1usize, 8, 32] {
            let e = connectors::embedders::LocalEmbedder::load(dir, batch).map_err(|e| anyhow::anyhow!(e))?;
            embedders.push(("local", batch, Arc::new(e)));
        }
    }
    #[cfg(not(feature = "local-embedder"))]
    anyhow::ensure!(args.model_dir.is_none(), "--model-dir: built without the local-embedder feature");
    for (kind, batch, e) in embedders {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let started = Instant::now();
        let mut n = 0usize;
        // At least two seconds and one pass over the texts.
        while n < refs.len() || started.elapsed() < Duration::from_secs(2) {
            let step = if kind == "hash" { refs.len() } else { refs.len().min(64) };
            let from = n % refs.len();
            let slice = &refs[from..(from + step).min(refs.len())];
            let _ = e.embed_batch(slice);
            n += slice.len();
        }
        let secs = started.elapsed().as_secs_f64();
        let row = serde_json::json!({
            "bench": "embed", "embedder": kind, "batch": batch, "dim": e.dim(), "texts": n,
            "mean_words": words, "seconds": secs, "embeddings_per_second": n as f64 / secs,
        });
        println!(
            "{}",
            if args.json {
                row.to_string()
            } else {
                format!("{kind:>5} batch {batch:>2}: {:>9.1} embeddings/s ({n} texts of {words:.0} words on average, {secs:.1} s, dim {})", n as f64 / secs, e.dim())
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}
