//! `engram bench llm`: the LLM client's overhead per call.

use std::process::ExitCode;

use super::BenchArgs;

pub(super) fn llm_bench(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    use axum::routing::post;
    use connectors::openai::{LlmMetrics, OpenAiClient, OpenAiConfig, OpenAiLlm, ResponseFormat};
    use operators::llm::Llm;
    use std::time::{Duration, Instant};
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let reply = serde_json::json!({"choices": [{"message": {"role": "assistant", "content": "{\"summary\": \"The council approved the sea wall.\"}"}}],
                                   "usage": {"prompt_tokens": 120, "completion_tokens": 9}});
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(move || {
            let r = reply.clone();
            async move { axum::Json(r) }
        }),
    );
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let base = format!("http://{}/v1", listener.local_addr()?);
    rt.spawn(async move { axum::serve(listener, app).await });
    let n = 2000usize;
    let texts = [
        "The council approved the sea wall budget after the cost rose to 26 million pounds.",
        "Fishermen said the quay flooded.",
    ];
    // Bare: one POST with a fixed body and no checks, the floor any client pays on this machine.
    let http = reqwest::Client::new();
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": texts.join(" ")}]});
    let url = format!("{base}/chat/completions");
    let bare = rt.block_on(async {
        let started = Instant::now();
        for _ in 0..n {
            let r = http.post(&url).json(&body).send().await?;
            let _: serde_json::Value = r.json().await?;
        }
        Ok::<_, reqwest::Error>(started.elapsed().as_secs_f64() / n as f64)
    })?;
    let cfg = OpenAiConfig {
        base_url: base,
        model: "m".into(),
        api_key: None,
        requests_per_minute: u32::MAX / 2,
        tokens_per_minute: u32::MAX / 2,
        max_in_flight: 4,
        timeout: Duration::from_secs(10),
        max_retries: 0,
        response_format: ResponseFormat::JsonSchema,
        max_tokens: 200,
        backoff: Duration::from_millis(10),
    };
    let client =
        OpenAiClient::new(cfg, LlmMetrics::new(&prometheus::Registry::new())?).map_err(|e| anyhow::anyhow!(e))?;
    let llm = OpenAiLlm::new(client, 80)?;
    let started = Instant::now();
    for _ in 0..n {
        llm.summarize(&texts).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let full = started.elapsed().as_secs_f64() / n as f64;
    rt.shutdown_background();
    let row = serde_json::json!({"bench": "llm", "calls": n, "bare_post_us": bare * 1e6, "client_call_us": full * 1e6, "overhead_us": (full - bare) * 1e6});
    println!(
        "{}",
        if args.json {
            row.to_string()
        } else {
            format!("{n} sequential calls: bare POST {:.0} µs, engram's client (summary stage) {:.0} µs: overhead {:.0} µs a call", bare * 1e6, full * 1e6, (full - bare) * 1e6)
        }
    );
    Ok(ExitCode::SUCCESS)
}
