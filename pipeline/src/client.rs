//! `engram ingest FILE… --url URL`: a client that sends record files to a running engine over its HTTP API, in
//! batches grouped by space, with a progress bar (records, rate, and the memory's frontier: the receipts the views
//! reflect) when stderr is a terminal and a plain line per batch group otherwise; it ends once the views hold the
//! last receipt.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct IngestArgs {
    /// JSONL record files (`-` reads stdin).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Base URL of a running engine.
    #[arg(long, default_value = "http://127.0.0.1:7600")]
    pub url: String,
    /// API token, sent as `Authorization: Bearer TOKEN`.
    #[arg(long, env = "ENGRAM_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The space of records that name none.
    #[arg(long)]
    pub space: Option<String>,
    /// Records per request (at most the engine's `ingest.max-records-per-request`).
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Do not wait for the views to hold the last receipt.
    #[arg(long)]
    pub no_wait: bool,
}

/// What one run did.
#[derive(Debug, Default)]
pub struct Sent {
    pub records: usize,
    pub accepted: usize,
    pub rejected: usize,
    pub last_receipt: Option<u64>,
}

struct Client {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
}

impl Client {
    fn req(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Posts one batch; on 503 (the engine's queue is full) waits and tries again.
    async fn post(&self, space: &str, lines: &[String]) -> anyhow::Result<serde_json::Value> {
        let url = format!("{}/v1/spaces/{space}/records", self.url);
        let body = lines.join("\n");
        let mut wait = Duration::from_millis(100);
        loop {
            let r = self.req(self.http.post(&url)).body(body.clone()).send().await?;
            let status = r.status();
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            if status.is_success() {
                return Ok(v);
            }
            if status.as_u16() == 503 && v["error"]["code"] == "overloaded" {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
                continue;
            }
            anyhow::bail!("{url}: {status}: {}", v["error"]["message"].as_str().unwrap_or("(no message)"));
        }
    }

    /// The epoch the views reflect.
    async fn as_of(&self) -> anyhow::Result<Option<u64>> {
        let v: serde_json::Value =
            self.req(self.http.get(format!("{}/healthz", self.url))).send().await?.json().await?;
        Ok(v["as_of"].as_u64())
    }
}

pub async fn run(args: IngestArgs) -> anyhow::Result<Sent> {
    anyhow::ensure!(args.batch >= 1, "--batch must be at least 1");
    let client =
        Client { http: reqwest::Client::new(), url: args.url.trim_end_matches('/').to_string(), token: args.token };
    let mut lines: Vec<(String, String)> = Vec::new();
    for path in &args.files {
        let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
            Box::new(std::io::BufReader::new(std::io::stdin()))
        } else {
            let f = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Box::new(std::io::BufReader::new(f))
        };
        for (i, line) in reader.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let named = serde_json::from_str::<serde_json::Value>(&line)
                .ok()
                .and_then(|v| v.get("space").and_then(|s| s.as_str()).map(str::to_string));
            let space = named.or_else(|| args.space.clone()).ok_or_else(|| {
                anyhow::anyhow!("{}:{}: the record names no space (give --space)", path.display(), i + 1)
            })?;
            lines.push((space, line));
        }
    }
    let total = lines.len();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = indicatif::ProgressBar::new(total as u64);
    if tty {
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} records ({per_sec}) {msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let started = Instant::now();
    let mut sent = Sent::default();
    let mut last_line = Instant::now();
    let mut i = 0;
    while i < lines.len() {
        let space = lines[i].0.clone();
        let mut j = i;
        while j < lines.len() && j - i < args.batch && lines[j].0 == space {
            j += 1;
        }
        let batch: Vec<String> = lines[i..j].iter().map(|(_, l)| l.clone()).collect();
        let r = client.post(&space, &batch).await?;
        sent.records += batch.len();
        sent.accepted += r["accepted"].as_u64().unwrap_or(0) as usize;
        sent.rejected += r["rejected_total"].as_u64().unwrap_or(0) as usize;
        if let Some(e) = r["receipt"].as_str().and_then(|e| e.parse::<u64>().ok()) {
            sent.last_receipt = sent.last_receipt.max(Some(e));
        }
        let frontier = client.as_of().await.unwrap_or(None);
        let msg = format!(
            "frontier {} / receipt {}",
            frontier.map_or("-".into(), |f| f.to_string()),
            sent.last_receipt.map_or("-".into(), |r| r.to_string())
        );
        bar.set_position(sent.records as u64);
        bar.set_message(msg.clone());
        if !tty && (last_line.elapsed() >= Duration::from_secs(2) || j == lines.len()) {
            let rate = sent.records as f64 / started.elapsed().as_secs_f64().max(1e-3);
            eprintln!("ingest: {}/{total} records ({rate:.0}/s), {} rejected, {msg}", sent.records, sent.rejected);
            last_line = Instant::now();
        }
        i = j;
    }
    if let (Some(receipt), false) = (sent.last_receipt, args.no_wait) {
        bar.set_message(format!("waiting for the views to reach receipt {receipt}"));
        while client.as_of().await?.is_none_or(|a| a < receipt) {
            bar.tick();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    bar.finish_and_clear();
    eprintln!(
        "ingested {} records ({} accepted, {} rejected) in {:.1}s; the views hold receipt {}",
        sent.records,
        sent.accepted,
        sent.rejected,
        started.elapsed().as_secs_f64(),
        sent.last_receipt.map_or("-".into(), |r| r.to_string())
    );
    Ok(sent)
}
