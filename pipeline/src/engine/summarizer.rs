//! The summariser: serves the requests the views list as waiting for the model (cluster summaries, session
//! segmentations, co-reference judgements). When one is due is [`Scheduler`]'s rule (a debounce per content key or,
//! for a summary, on its cluster's members, and a latency bound for live sessions); a grown cluster may reuse an earlier summary ([`SummaryCache::plan`]). The
//! rest go to the model on up to `llm.max-in-flight` threads. Each reply is appended to the response log (fsync'd)
//! and queued as an input for the next epoch. A failed request is retried after another debounce, up to
//! `llm.max-failures` attempts; then its extractive answer is logged in its place, with the reason, and it is asked
//! again only when its content (so its key) changes.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use connectors::LoggedResponse;
use operators::llm::LlmError;
use operators::request::{ModelRequest, RequestKind};
use operators::summary::{Coverage, Plan, Scheduler, Waiting};

use super::state::Shared;

/// A request sent to a model thread: `((space, key), request, coverage to record)`.
type Job = ((String, String), ModelRequest, Option<Coverage>);
/// Its reply, with the time it took.
type Done = ((String, String), ModelRequest, Result<String, LlmError>, Duration, Option<Coverage>);

/// Starts the model threads and the summariser's loop; the loop ends at shutdown.
pub(super) fn spawn_summarizer(shared: Arc<Shared>) -> std::thread::JoinHandle<()> {
    let (job_tx, job_rx) = mpsc::channel::<Job>();
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let job_rx = Arc::new(Mutex::new(job_rx));
    for i in 0..shared.config.llm.max_in_flight.max(1) {
        spawn_model_thread(i, shared.clone(), job_rx.clone(), done_tx.clone());
    }
    std::thread::Builder::new()
        .name("engram-summarizer".into())
        .spawn(move || {
            let run = std::panic::AssertUnwindSafe(|| summarize(&shared, &job_tx, &done_rx));
            if let Err(panic) = std::panic::catch_unwind(run) {
                shared.fail(format!("the summariser died: {}", super::panic_message(&panic)));
            }
        })
        .expect("spawn summarizer")
}

fn spawn_model_thread(i: usize, shared: Arc<Shared>, jobs: Arc<Mutex<Receiver<Job>>>, done: Sender<Done>) {
    std::thread::Builder::new()
        .name(format!("engram-llm-{i}"))
        .spawn(move || loop {
            let job = jobs.lock().expect("job lock").recv();
            let Ok((key, request, covers)) = job else { return };
            let t = Instant::now();
            // A reply that makes the client panic must not leave its request in flight for ever, silently: the
            // engine fails loudly (`/healthz` 503, exit 1), as when a worker dies.
            let ask = std::panic::AssertUnwindSafe(|| request.ask(shared.llm.as_ref(), &key.1));
            let out = match std::panic::catch_unwind(ask) {
                Ok(out) => out,
                Err(panic) => {
                    shared.fail(format!("model thread {i} died: {}", super::panic_message(&panic)));
                    return;
                }
            };
            if done.send((key, request, out, t.elapsed(), covers)).is_err() {
                return;
            }
        })
        .expect("spawn LLM worker");
}

/// The summariser's loop: every 20 ms, what is due (the waiting list taken again when the views' requests change) and what
/// came back.
fn summarize(shared: &Shared, jobs: &Sender<Job>, done_rx: &Receiver<Done>) {
    let config = &shared.config;
    let mut scheduler = Scheduler::new(config.hierarchy.summary_debounce, config.events.max_latency);
    let origin = Instant::now();
    let model = shared.llm.model().to_string();
    let logged = |space: String, key: String, response: String, covers: Option<Coverage>| LoggedResponse {
        model: model.clone(),
        space,
        key,
        response,
        covers,
        fallback: None,
    };
    // Failed attempts per request; past `llm.max-failures` its extractive answer is logged in its place.
    let mut failures: HashMap<(String, String), u32> = HashMap::new();
    let extractive = operators::extractive::Extractive { max_words: config.hierarchy.summary_words };
    // What waits, and when the members of each cluster waiting for its summary last changed: taken again only when
    // the views' requests or clusters change (and at least every second), not every tick.
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut members_since: HashMap<String, HashMap<String, Duration>> = HashMap::new();
    let (mut version, mut taken) = (None, Instant::now());
    while !shared.stopping() {
        let changed = {
            let views = shared.views();
            let changed = version != Some(views.requests_version) || taken.elapsed() >= Duration::from_secs(1);
            if changed {
                (version, taken) = (Some(views.requests_version), Instant::now());
                waiting = views
                    .spaces
                    .iter()
                    .flat_map(|(s, v)| v.requests.iter().map(move |(k, r)| ((s.clone(), k.clone()), r.clone())))
                    .collect();
                members_since.clear();
                for ((s, _), r) in &waiting {
                    if let ModelRequest::Summary { cluster, .. } = r.as_ref() {
                        let at =
                            views.spaces.get(s).and_then(|v| v.clusters.get(cluster)).and_then(|c| c.members_since);
                        if let Some(at) = at {
                            members_since
                                .entry(s.clone())
                                .or_default()
                                .insert(cluster.clone(), at.saturating_duration_since(origin));
                        }
                    }
                }
            }
            changed
        };
        let now = origin.elapsed();
        let backlog = shared.structure_backlog.load(std::sync::atomic::Ordering::SeqCst);
        scheduler.hold_summaries(backlog > config.llm.summary_hold_backlog);
        let mut done = Vec::new();
        let due = if changed || scheduler.check_due(now) {
            scheduler.due_given(&waiting, now, |s, c| members_since.get(s).and_then(|m| m.get(c)).copied())
        } else {
            Vec::new()
        };
        for ((space, key), request) in due {
            let plan = shared.summary_cache.lock().expect("summary cache lock").plan(space, key, request);
            if let Some(reply) = shared.legacy_reply(space, key, request) {
                shared.metrics.responses_upgraded.inc();
                let covers = match plan {
                    Plan::Reuse { coverage, .. } => Some(coverage),
                    Plan::Ask(coverage) => coverage,
                };
                if let Some(c) = &covers {
                    shared.summary_cache.lock().expect("summary cache lock").record(space, c, &reply);
                }
                done.push(logged(space.clone(), key.clone(), reply, covers));
                continue;
            }
            match plan {
                Plan::Reuse { text, coverage } => {
                    shared.metrics.summaries_reused.inc();
                    done.push(logged(space.clone(), key.clone(), text, Some(coverage)));
                }
                Plan::Ask(coverage) => {
                    let _ = jobs.send(((space.clone(), key.clone()), request.as_ref().clone(), coverage));
                }
            }
        }
        while let Ok((key, request, out, took, covers)) = done_rx.try_recv() {
            let kind = request.kind();
            match out {
                Ok(reply) => {
                    failures.remove(&key);
                    if !shared.has_model() && kind == RequestKind::Summary {
                        shared.metrics.llm.requests.with_label_values(&["summary", "ok"]).inc();
                        shared.metrics.llm.duration.with_label_values(&["summary"]).observe(took.as_secs_f64());
                    }
                    if let Some(c) = &covers {
                        shared.summary_cache.lock().expect("summary cache lock").record(&key.0, c, &reply);
                    }
                    done.push(logged(key.0, key.1, reply, covers));
                }
                Err(e) => {
                    let n = failures.entry(key.clone()).or_default();
                    *n += 1;
                    if *n < config.llm.max_failures.max(1) {
                        tracing::warn!(error = %e, kind = kind.name(), attempt = *n, "model request failed; retried after the debounce");
                        scheduler.retry(&key, origin.elapsed());
                        continue;
                    }
                    failures.remove(&key);
                    match request.fallback(&extractive, &key.1) {
                        Ok(reply) => {
                            tracing::warn!(error = %e, kind = kind.name(), attempts = config.llm.max_failures,
                                "model request failed every time; its extractive answer is logged in its place");
                            shared.metrics.llm_fallbacks.with_label_values(&[kind.name()]).inc();
                            let mut r = logged(key.0, key.1, reply, None);
                            r.fallback = Some(e.to_string());
                            done.push(r);
                        }
                        Err(f) => {
                            tracing::error!(error = %e, fallback = %f, "model request failed and has no fallback");
                            scheduler.retry(&key, origin.elapsed());
                        }
                    }
                }
            }
        }
        if !done.is_empty() {
            if let Err(e) = shared.response_log.lock().expect("response log lock").append(&done) {
                // Not logged means not used: the same requests come round again.
                tracing::error!(error = %e, "could not append to the response log");
                for r in &done {
                    scheduler.resend(&(r.space.clone(), r.key.clone()));
                }
            } else {
                shared.outputs.responses(&done);
                shared.queue_replies(done.into_iter().map(|r| (r.space, r.key, r.response)));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
