//! `engram`: a streaming memory engine for LLM agents. This file is the CLI: it parses the command line and calls
//! the library (`engram::engine::Engine` for `run`, `engram::eval`, `engram::bench`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgAction, Args, Parser, Subcommand};
use connectors::{FileSource, InputLog, ResponseLog, StdinSource};

use engram::config::{Config, Overrides};
use engram::engine::{Engine, Place, Shared};
use engram::{bench, http};

/// mimalloc rather than the system allocator: the dataflow allocates and frees millions of small strings and
/// vectors per epoch, and glibc's malloc spent a third of ingest in its own bookkeeping (`engram bench ingest`
/// under perf: `_int_malloc`, `malloc_consolidate`, `unlink_chunk`). Built without transparent huge pages (the
/// workspace's `no_thp`): with them, a fifth of ingest went to the kernel zeroing 2 MiB pages that mimalloc had
/// purged and touched again (`clear_page_erms` under `do_huge_pmd_anonymous_page`).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "engram",
    version,
    about = "A streaming memory engine for LLM agents (CAM + CompassMem on timely/differential dataflow)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Ingest records (files, stdin, HTTP) and serve the memory over HTTP until stopped (SIGINT/SIGTERM).
    Run(RunArgs),
    /// Query a running engine and print the response JSON.
    Query(QueryArgs),
    /// Measure throughput (`engram bench ingest|theta|hierarchy`).
    Bench(bench::BenchArgs),
    /// Evidence recall of retrieval on a public benchmark (`engram eval locomo --data FILE`).
    Eval(engram::eval::EvalArgs),
    /// Embed each line of stdin with the configured embedder; print one JSON array per line.
    Embed(EmbedArgs),
    /// Make API tokens (`engram token new`) or hash one (`engram token hash`).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Check the data directory's logs line by line (`engram log check`), or move their bad lines aside
    /// (`engram log repair`).
    Log(LogArgs),
    /// MCP over stdio for a desktop client, relayed to a running engine's `/mcp` (streamable HTTP).
    Mcp(McpArgs),
    /// Send record files to a running engine over HTTP, with progress (records, rate, the memory's frontier).
    Ingest(engram::client::IngestArgs),
}

#[derive(Args)]
struct McpArgs {
    /// Base URL of a running engine.
    #[arg(long, default_value = "http://127.0.0.1:7600")]
    url: String,
    /// API token, sent as `Authorization: Bearer TOKEN`.
    #[arg(long, env = "ENGRAM_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(Args)]
struct LogArgs {
    /// check | repair
    action: String,
    /// The data directory (default: the config's `data-dir`); its `process-N` directories are included.
    #[arg(long = "data-dir")]
    data_dir: Option<PathBuf>,
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Print a new random token and the `[[auth.tokens]]` table (with its hash) that grants it.
    New {
        /// Who holds it.
        #[arg(long)]
        name: String,
        /// read | write | admin
        #[arg(long, default_value = "read")]
        scope: String,
        /// Spaces it reaches, comma-separated: names, prefixes ending in `*`, or `*` for all.
        #[arg(long, value_delimiter = ',', required = true)]
        spaces: Vec<String>,
        /// The most spaces it may create (0: no limit beyond ingest.max-spaces).
        #[arg(long = "max-spaces", default_value_t = 0)]
        max_spaces: usize,
    },
    /// Read a token from stdin and print its hash (what the config keeps).
    Hash,
}

#[derive(Args)]
struct EmbedArgs {
    /// Configuration file (TOML); layered over the embedded defaults and under ENGRAM__* variables.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// timely's own flags (-w, -n, -p, -h) keep their meaning; `--help` shows help (-h is the hostfile).
#[derive(Args, Clone, Debug)]
#[command(disable_help_flag = true)]
pub struct TimelyArgs {
    /// Worker threads per process.
    #[arg(short = 'w', long = "workers", default_value_t = 1)]
    pub workers: usize,
    /// Number of processes in the cluster.
    #[arg(short = 'n', long = "processes", default_value_t = 1)]
    pub processes: usize,
    /// This process's index in the cluster (0 serves HTTP).
    #[arg(short = 'p', long = "process", default_value_t = 0)]
    pub process: usize,
    /// File with one `host:port` per process.
    #[arg(short = 'h', long = "hostfile")]
    pub hostfile: Option<PathBuf>,
}

impl TimelyArgs {
    pub fn config(&self) -> anyhow::Result<timely::Config> {
        use timely::CommunicationConfig as C;
        anyhow::ensure!(self.workers >= 1, "-w must be at least 1");
        anyhow::ensure!(self.process < self.processes, "-p {} must be below -n {}", self.process, self.processes);
        let communication = if self.processes > 1 {
            let addresses: Vec<String> = match &self.hostfile {
                Some(path) => std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("hostfile {}: {e}", path.display()))?
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .take(self.processes)
                    .map(String::from)
                    .collect(),
                None => (0..self.processes).map(|i| format!("localhost:{}", 2101 + i)).collect(),
            };
            anyhow::ensure!(
                addresses.len() == self.processes,
                "the hostfile names {} of {} processes",
                addresses.len(),
                self.processes
            );
            C::Cluster { threads: self.workers, process: self.process, addresses, report: false, zerocopy: false }
        } else if self.workers > 1 {
            C::Process(self.workers)
        } else {
            C::Thread
        };
        Ok(timely::Config { communication, worker: timely::WorkerConfig::default() })
    }
}

#[derive(Args)]
#[command(disable_help_flag = true)]
struct RunArgs {
    /// Configuration file (TOML); layered over the embedded defaults, under ENGRAM__* variables and flags.
    #[arg(long)]
    config: Option<PathBuf>,
    /// JSONL record file to ingest (repeatable); `-` reads stdin.
    #[arg(long = "input")]
    inputs: Vec<PathBuf>,
    /// Keep reading the input files as they grow.
    #[arg(long)]
    follow: bool,
    /// HTTP API address.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Admin address (/metrics, /healthz).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Once the --input files are ingested, answer `SPACE:QUESTION` and print the response (repeatable).
    #[arg(long = "ask", value_name = "SPACE:QUESTION")]
    asks: Vec<String>,
    /// The retrieval mode of the --ask answers: flat | hybrid | prune-and-grow | compass.
    #[arg(long = "ask-mode", default_value = engram::query::Mode::DEFAULT.as_str())]
    ask_mode: String,
    /// Exit after the --ask answers are printed, instead of serving.
    #[arg(long)]
    once: bool,
    /// Data directory (input log, dead-letter file).
    #[arg(long = "data-dir")]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    timely: TimelyArgs,
    /// Print help.
    #[arg(long, action = ArgAction::Help)]
    help: Option<bool>,
}

#[derive(Args)]
struct QueryArgs {
    /// Base URL of a running engine.
    #[arg(long, default_value = "http://127.0.0.1:7600")]
    url: String,
    #[arg(long)]
    space: String,
    /// compass | prune-and-grow | hybrid | flat
    #[arg(long, default_value = engram::query::Mode::DEFAULT.as_str())]
    mode: String,
    #[arg(long = "budget-words")]
    budget_words: Option<usize>,
    #[arg(long)]
    k: Option<usize>,
    /// Wait until the memory includes this ingest receipt.
    #[arg(long)]
    after: Option<String>,
    /// API token, sent as `Authorization: Bearer TOKEN`.
    #[arg(long, env = "ENGRAM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The question.
    question: String,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ENGRAM_LOG")
                .unwrap_or_else(|_| "info,hnsw_rs=warn,rmcp::service=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(args),
        Command::Query(args) => query(args),
        Command::Bench(args) => bench::run(args),
        Command::Eval(args) => engram::eval::run(args),
        Command::Embed(args) => embed(args),
        Command::Token(cmd) => token(cmd),
        Command::Log(args) => log(args),
        Command::Ingest(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(engram::client::run(args)))
            .map(|_| ExitCode::SUCCESS),
        Command::Mcp(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(engram::mcp::stdio_relay(&args.url, args.token.as_deref())))
            .map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let overrides = Overrides { data_dir: args.data_dir.clone(), listen: args.listen, admin: args.admin };
    let config = match Config::load(args.config.as_deref(), std::env::vars(), &overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let timely_config = args.timely.config()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut signals = rt.block_on(async { http::Signals::register() })?;
    for ask in &args.asks {
        anyhow::ensure!(
            ask.split_once(':').is_some_and(|(s, q)| !s.is_empty() && !q.trim().is_empty()),
            "--ask {ask:?}: expected SPACE:QUESTION"
        );
    }
    let ask_mode: engram::query::Mode = serde_json::from_value(serde_json::json!(args.ask_mode)).map_err(|_| {
        anyhow::anyhow!("--ask-mode {:?}: expected flat, hybrid, prune-and-grow or compass", args.ask_mode)
    })?;
    anyhow::ensure!(
        !args.once || !args.follow,
        "--once and --follow contradict each other: a followed file never ends"
    );
    let place = Place { process: args.timely.process, processes: args.timely.processes };
    let serving = place.leads();
    if serving {
        let access = engram::auth::Access::load(&config.auth).unwrap_or_default();
        if let Err(e) = engram::auth::check_listen(config.listen, &access, &config.auth) {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
        if access.enabled() {
            tracing::info!(tokens = access.len(), "the API needs a token (Authorization: Bearer)");
        } else if config.listen.ip().is_loopback() {
            tracing::info!(listen = %config.listen, "no API token is configured: the API is open, on loopback only");
        } else {
            tracing::warn!(listen = %config.listen, "no API token is configured and auth.allow-unauthenticated is set: anyone who reaches the port can read, write and delete every space");
        }
    }
    // Every process keeps its own input log and dead-letter file (process p > 0 under DATA_DIR/process-p).
    let mut engine = Engine::open(config, place)?;
    let shared = engine.shared().clone();
    // Bind before starting anything, so a taken port fails fast and clearly.
    let listeners = if serving { Some(bind(&rt, shared.config.listen, shared.config.admin)?) } else { None };
    // A follower serves its own /metrics and /healthz when given --admin (its Kafka lag, records, commits).
    let follower_admin = match (serving, args.admin) {
        (false, Some(addr)) => Some(
            rt.block_on(tokio::net::TcpListener::bind(addr))
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (admin): {e}"))?,
        ),
        _ => None,
    };
    add_sources(&mut engine, &args, place)?;
    engine.start(timely_config)?;

    let Some((api, admin)) = listeners else {
        // A follower process: it runs its workers until process 0 closes the dataflow, or until signalled.
        if let Some(listener) = follower_admin {
            let app = http::admin(shared.clone());
            rt.spawn(async move { axum::serve(listener, app).await });
        }
        let finished = rt.block_on(async {
            let join = tokio::task::spawn_blocking(move || {
                let mut engine = engine;
                engine.join_workers()
            });
            tokio::select! {
                r = join => Some(r),
                _ = signals.recv() => None,
            }
        });
        return match finished {
            Some(Ok(r)) => r.map(|()| ExitCode::SUCCESS),
            Some(Err(e)) => Err(anyhow::anyhow!("worker thread: {e}")),
            None => Ok(ExitCode::SUCCESS),
        };
    };
    let (api_addr, admin_addr) = (api.local_addr()?, admin.local_addr()?);
    tracing::info!(%api_addr, %admin_addr, data_dir = %shared.config.data_dir.display(), "engram is serving");
    let asks = Asks { asks: args.asks.clone(), mode: ask_mode, once: args.once };
    rt.block_on(serve(shared.clone(), (api, admin), asks, signals));
    if let Some(reason) = shared.failure() {
        // A dead worker's peers and network threads cannot be joined: the process exits non-zero without them.
        std::mem::forget(engine);
        anyhow::bail!("the engine failed: {reason}");
    }
    engine.stop()?;
    Ok(ExitCode::SUCCESS)
}

/// The `--ask` questions, their mode, and whether to stop once they are answered.
struct Asks {
    asks: Vec<String>,
    mode: engram::query::Mode,
    once: bool,
}

/// Serves the API and admin ports until a signal, or until the `--ask` answers are out with `--once`; then lets
/// the servers finish their requests.
async fn serve(
    shared: std::sync::Arc<Shared>,
    (api, admin): (tokio::net::TcpListener, tokio::net::TcpListener),
    asks: Asks,
    mut signals: http::Signals,
) {
    let (api_app, admin_app) = (http::api(shared.clone()), http::admin(shared.clone()));
    let shared_for_failure = shared.clone();
    let limits = engram::server::ConnLimits {
        header_read_timeout: shared.config.http.header_read_timeout,
        max_connections: shared.config.http.max_connections,
    };
    let (tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let (mut rx1, mut rx2) = (tx.subscribe(), tx.subscribe());
    let a = tokio::spawn(engram::server::serve(api, api_app, limits, async move {
        let _ = rx1.recv().await;
    }));
    let b = tokio::spawn(engram::server::serve(admin, admin_app, limits, async move {
        let _ = rx2.recv().await;
    }));
    let after_asks = async move {
        if !answer_asks(shared, asks.asks, asks.mode, asks.once).await {
            std::future::pending::<()>().await;
        }
    };
    let failed = {
        let shared = shared_for_failure;
        async move {
            while shared.failure().is_none() {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    };
    tokio::select! {
        _ = signals.recv() => {}
        _ = after_asks => {}
        _ = failed => {}
    }
    tracing::info!("stopping: finishing the open epoch");
    let _ = tx.send(());
    let _ = a.await;
    let _ = b.await;
}

/// Binds the API and admin listeners.
fn bind(
    rt: &tokio::runtime::Runtime,
    api: SocketAddr,
    admin: SocketAddr,
) -> anyhow::Result<(tokio::net::TcpListener, tokio::net::TcpListener)> {
    let (a, b) =
        rt.block_on(async { (tokio::net::TcpListener::bind(api).await, tokio::net::TcpListener::bind(admin).await) });
    let a = a.map_err(|e| anyhow::anyhow!("cannot listen on {api}: {e}"))?;
    let b = b.map_err(|e| anyhow::anyhow!("cannot listen on {admin} (admin): {e}"))?;
    Ok((a, b))
}

/// The --input files (process 0, each resumed after what the input log holds) and the Kafka source (every process
/// reads its share of the partitions: the i-th of all (topic, partition) pairs, in order, goes to process i mod n).
fn add_sources(engine: &mut Engine, args: &RunArgs, place: Place) -> anyhow::Result<()> {
    let shared = engine.shared().clone();
    if !place.leads() && !args.inputs.is_empty() {
        tracing::warn!(
            process = place.process,
            "--input is read by process 0 only; this process reads its share of the Kafka partitions"
        );
    }
    if place.leads() {
        for path in &args.inputs {
            if path.as_os_str() == "-" {
                engine.add_source(Box::new(StdinSource::spawn()), "stdin");
                continue;
            }
            anyhow::ensure!(args.follow || path.exists(), "input file {} does not exist", path.display());
            let source = FileSource::new(path, args.follow);
            let after = shared.resume.get(&connectors::Source::name(&source)).copied().unwrap_or(0);
            if after > 0 {
                tracing::info!(path = %path.display(), after_line = after, "resuming an input file after what the input log holds");
            }
            engine.add_source(Box::new(source.resume_after(after)), "file");
        }
    }
    let k = &shared.config.kafka;
    if !k.topics.is_empty() {
        #[cfg(feature = "kafka")]
        {
            let share = connectors::kafka::Share { index: place.process, peers: place.processes };
            let metrics = Some(shared.metrics.kafka.clone());
            let source =
                connectors::kafka::KafkaSource::new(&k.brokers, &k.group_id, &k.topics, share, &shared.resume, metrics)
                    .map_err(|e| anyhow::anyhow!("kafka: {e}"))?;
            engine.add_source(Box::new(source), "kafka");
        }
    }
    Ok(())
}

/// Waits until the --input files are in the views, prints each --ask answer, and returns whether to stop (--once).
async fn answer_asks(shared: std::sync::Arc<Shared>, asks: Vec<String>, mode: engram::query::Mode, once: bool) -> bool {
    if asks.is_empty() && !once {
        return false;
    }
    let epoch = loop {
        if let Some(e) = shared.inputs_settled() {
            break e;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    if let Some(e) = epoch {
        let mut rx = shared.watch_hierarchy_as_of();
        let _ = rx.wait_for(|a| a.is_some_and(|a| a >= e)).await;
    }
    for ask in asks {
        let (space, question) = ask.split_once(':').expect("checked at start");
        let req = engram::query::QueryRequest {
            query: question.trim().to_string(),
            mode,
            budget_words: None,
            k: Some(3),
            answer: None,
            use_model: None,
        };
        let s = shared.clone();
        let space = space.to_string();
        let out = tokio::task::spawn_blocking(move || engram::service::execute(&s, &space, &req)).await;
        match out {
            Ok(Ok(resp)) => println!("{}", serde_json::to_string_pretty(&resp).unwrap_or_default()),
            Ok(Err(e)) => eprintln!("--ask {ask:?}: {e} ({})", e.code()),
            Err(e) => eprintln!("--ask {ask:?}: {e}"),
        }
    }
    once
}

fn query(args: QueryArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let mut url = format!("{}/v1/spaces/{}/query", args.url.trim_end_matches('/'), args.space);
        if let Some(a) = &args.after {
            url.push_str(&format!("?after={a}"));
        }
        let body = serde_json::json!({
            "query": args.question, "mode": args.mode, "budget_words": args.budget_words, "k": args.k,
        });
        let mut request = reqwest::Client::new().post(&url).json(&body);
        if let Some(t) = &args.token {
            request = request.bearer_auth(t);
        }
        let resp = request.send().await.map_err(|e| anyhow::anyhow!("cannot reach {url}: {e}"))?;
        let status = resp.status();
        let text = resp.text().await?;
        let pretty = serde_json::from_str::<serde_json::Value>(&text)
            .map(|v| serde_json::to_string_pretty(&v).unwrap_or(text.clone()))
            .unwrap_or(text);
        println!("{pretty}");
        Ok(if status.is_success() { ExitCode::SUCCESS } else { ExitCode::from(1) })
    })
}

fn log(args: LogArgs) -> anyhow::Result<ExitCode> {
    use connectors::embedders::EmbeddingLog;
    use connectors::input_log::Check;
    let repair = match args.action.as_str() {
        "check" => false,
        "repair" => true,
        other => anyhow::bail!("engram log {other:?}: expected check or repair"),
    };
    let overrides = Overrides { data_dir: args.data_dir.clone(), ..Overrides::default() };
    let config = Config::load(args.config.as_deref(), std::env::vars(), &overrides)?;
    let mut dirs = vec![config.data_dir.clone()];
    if let Ok(entries) = std::fs::read_dir(&config.data_dir) {
        let mut more: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("process-")))
            .collect();
        more.sort();
        dirs.extend(more);
    }
    let mut bad = 0;
    for dir in dirs {
        for name in ["input.log", "responses.log", "embeddings.log"] {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            let run = |p: &std::path::Path| -> std::io::Result<Check> {
                match (name, repair) {
                    ("input.log", false) => InputLog::check(p),
                    ("input.log", true) => InputLog::repair(p),
                    ("responses.log", false) => ResponseLog::check(p),
                    ("responses.log", true) => ResponseLog::repair(p),
                    (_, false) => EmbeddingLog::check(p),
                    (_, true) => EmbeddingLog::repair(p),
                }
            };
            let c = run(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            println!(
                "{}: {} lines read ({} without a checksum), {} bad, torn tail {} bytes",
                path.display(),
                c.good,
                c.unchecked,
                c.bad.len(),
                c.torn_bytes
            );
            for b in &c.bad {
                println!("  line {} at byte offset {}: {}", b.line, b.offset, b.reason);
            }
            if repair && (!c.bad.is_empty() || c.torn_bytes > 0) {
                println!("  moved to {}.quarantine; the log keeps the rest, in order", path.display());
            }
            bad += c.bad.len();
        }
    }
    Ok(if bad > 0 && !repair { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn token(cmd: TokenCommand) -> anyhow::Result<ExitCode> {
    use engram::auth::{hash_token, new_token, Access, AuthConfig, Scope, TokenConfig};
    match cmd {
        TokenCommand::New { name, scope, spaces, max_spaces } => {
            let scope: Scope = serde_json::from_value(serde_json::json!(scope))
                .map_err(|_| anyhow::anyhow!("--scope {scope:?}: expected read, write or admin"))?;
            let token = new_token();
            let config = TokenConfig { name, hash: hash_token(&token), scope, spaces, max_spaces };
            // The same checks as at start, so that what is printed loads.
            let auth = AuthConfig { tokens: vec![config.clone()], ..Default::default() };
            Access::load(&auth).map_err(|e| anyhow::anyhow!("{}", e.join("; ")))?;
            let spaces: Vec<String> = config.spaces.iter().map(|s| format!("{s:?}")).collect();
            eprintln!("The token (give it to its holder; engram keeps only its hash):");
            println!("{token}");
            eprintln!("\nAdd to the config file (or, without the `auth.` prefix, to auth.tokens-file):\n");
            eprintln!("[[auth.tokens]]");
            eprintln!("name = {:?}", config.name);
            eprintln!("hash = \"{}\"", config.hash);
            eprintln!("scope = \"{}\"", config.scope.as_str());
            eprintln!("spaces = [{}]", spaces.join(", "));
            if max_spaces > 0 {
                eprintln!("max-spaces = {max_spaces}");
            }
        }
        TokenCommand::Hash => {
            let mut token = String::new();
            std::io::stdin().read_line(&mut token)?;
            let token = token.trim();
            anyhow::ensure!(!token.is_empty(), "no token on stdin");
            println!("{}", hash_token(token));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn embed(args: EmbedArgs) -> anyhow::Result<ExitCode> {
    use std::io::{BufRead, Write};
    let config = Config::load(args.config.as_deref(), std::env::vars().collect::<Vec<_>>(), &Overrides::default())?;
    let dir = std::env::temp_dir().join(format!("engram-embed-{}", std::process::id()));
    let embedder = engram::engine::make_embedder(&config, &engram::metrics::Metrics::new(), &dir)?;
    let lines: Vec<String> = std::io::stdin().lock().lines().collect::<Result<_, _>>()?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for batch in lines.chunks(64) {
        let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
        for v in embedder.embed_batch(&refs) {
            writeln!(out, "{}", serde_json::to_string(&v)?)?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
