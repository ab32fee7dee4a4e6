//! `engram eval locomo --data FILE` and `engram eval qmsum --data DIR`: evidence recall of retrieval. Every
//! conversation (LoCoMo) or meeting (QMSum) is ingested into its own space through the real engine (dataflow,
//! hierarchy, summaries, events), then each question is asked in every mode at budgets of 250, 500 and 1,000 words;
//! recall is the share of the gold turns found among the layer-0 turns of the evidence — LoCoMo: the evidence
//! `dia_id`s of categories 1–4; QMSum: the transcript turns inside each query's `relevant_text_span`s (categories
//! `specific` and `general`). With an LLM configured (`llm.backend = "openai"`), every retrieval is also answered
//! from its evidence and the answer scored against the gold one: token F1 and BLEU-1 for LoCoMo, ROUGE-L for QMSum
//! (`crate::score`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::{json, Value};

use crate::config::{Config, Overrides};
use crate::engine::{Engine, Place, Shared};
use crate::query::{Mode, QueryRequest};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Dataset {
    Locomo,
    Qmsum,
}

#[derive(Args)]
pub struct EvalArgs {
    dataset: Dataset,
    /// The LoCoMo JSON file (e.g. ../shared/data/locomo/locomo-dev.json), or a directory of QMSum meeting files
    /// (e.g. ../shared/data/qmsum/val).
    #[arg(long)]
    data: PathBuf,
    /// Modes to evaluate (default: flat, hybrid, prune-and-grow and compass).
    #[arg(long = "mode", value_parser = ["flat", "hybrid", "prune-and-grow", "compass"])]
    modes: Vec<String>,
    /// Evidence budgets in words.
    #[arg(long, value_delimiter = ',', default_value = "250,500,1000")]
    budgets: Vec<usize>,
    /// Write `{"dataset","results":[{"mode","budget_words","category","n","recall"}]}` here.
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long)]
    config: Option<PathBuf>,
}

struct Question {
    space: String,
    text: String,
    category: String,
    gold: BTreeSet<String>,
    /// The gold answer, when the data has one.
    answer: Option<String>,
}

/// A gold answer as text (LoCoMo has numbers among its answers).
fn answer_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn load_qmsum(dir: &PathBuf) -> anyhow::Result<(Vec<Value>, Vec<Question>)> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("{}: {e} (expected a directory of QMSum meeting files)", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    names.sort();
    anyhow::ensure!(!names.is_empty(), "{}: no .json meeting files", dir.display());
    let mut records = Vec::new();
    let mut questions = Vec::new();
    for path in names {
        let m: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let space = path.file_stem().and_then(|s| s.to_str()).unwrap_or("meeting").to_lowercase();
        let transcript = m["meeting_transcripts"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("{}: no meeting_transcripts", path.display()))?;
        let mut turns = BTreeSet::new();
        for (i, t) in transcript.iter().enumerate() {
            let text = t["content"].as_str().unwrap_or("").trim();
            if text.is_empty() {
                continue;
            }
            turns.insert(format!("t{i}"));
            records
                .push(json!({"space": space, "kind": "turn", "conversation": space, "turn": format!("t{i}"), "seq": i,
                                "speaker": t["speaker"], "text": text}));
        }
        for (list, category) in [("specific_query_list", "specific"), ("general_query_list", "general")] {
            for q in m[list].as_array().into_iter().flatten() {
                let mut gold = BTreeSet::new();
                for span in q["relevant_text_span"].as_array().into_iter().flatten() {
                    let bound = |i: usize| {
                        span[i]
                            .as_str()
                            .and_then(|x| x.trim().parse::<usize>().ok())
                            .or_else(|| span[i].as_u64().map(|x| x as usize))
                    };
                    if let (Some(a), Some(b)) = (bound(0), bound(1)) {
                        gold.extend((a..=b).map(|i| format!("t{i}")).filter(|t| turns.contains(t)));
                    }
                }
                if gold.is_empty() {
                    continue;
                }
                questions.push(Question {
                    space: space.clone(),
                    text: q["query"].as_str().unwrap_or("").into(),
                    category: category.into(),
                    gold,
                    answer: answer_text(&q["answer"]),
                });
            }
        }
    }
    Ok((records, questions))
}

fn load_locomo(path: &PathBuf) -> anyhow::Result<(Vec<Value>, Vec<Question>)> {
    let data: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut records = Vec::new();
    let mut questions = Vec::new();
    for conv in data.as_array().ok_or_else(|| anyhow::anyhow!("{}: expected a JSON array", path.display()))? {
        let space = conv["sample_id"].as_str().unwrap_or("conv").replace('_', "-");
        let c = &conv["conversation"];
        let mut turns = BTreeSet::new();
        let mut n = 1;
        while let Some(session) = c.get(format!("session_{n}")).and_then(Value::as_array) {
            let when = c.get(format!("session_{n}_date_time")).cloned().unwrap_or(Value::Null);
            for t in session {
                let mut text = t["text"].as_str().unwrap_or("").to_string();
                if let Some(cap) = t["blip_caption"].as_str() {
                    text.push_str(&format!(" [shares a photo: {cap}]"));
                }
                let id = t["dia_id"].as_str().unwrap_or("").to_string();
                turns.insert(id.clone());
                records.push(json!({"space": space, "kind": "turn", "conversation": space, "turn": id,
                                    "speaker": t["speaker"], "text": text, "ts": when}));
            }
            n += 1;
        }
        for qa in conv["qa"].as_array().into_iter().flatten() {
            let category = qa["category"].as_u64().unwrap_or(0);
            let label = category.to_string();
            if !(1..=4).contains(&category) {
                continue;
            }
            // A few evidence ids in the source name no turn (e.g. "D"): skipped.
            let gold: BTreeSet<String> = qa["evidence"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e.as_str())
                .flat_map(|e| e.split(';').map(|x| x.trim().to_string()))
                .filter(|e| turns.contains(e))
                .collect();
            if gold.is_empty() {
                continue;
            }
            questions.push(Question {
                space: space.clone(),
                text: qa["question"].as_str().unwrap_or("").into(),
                category: label,
                gold,
                answer: answer_text(&qa["answer"]),
            });
        }
    }
    Ok((records, questions))
}

pub fn run(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let (records, questions) = match args.dataset {
        Dataset::Locomo => load_locomo(&args.data)?,
        Dataset::Qmsum => load_qmsum(&args.data)?,
    };
    let modes = parse_modes(&args.modes)?;
    let dir = tempfile_dir()?;
    let overrides = Overrides { data_dir: Some(dir.clone()), ..Overrides::default() };
    let mut env: Vec<(String, String)> = std::env::vars().collect();
    env.push(("ENGRAM__HIERARCHY__SUMMARY_DEBOUNCE".into(), "10ms".into()));
    // An evaluation's memory is rebuilt from its files on every run: nothing to restart from.
    env.push(("ENGRAM__CHECKPOINT__INTERVAL".into(), "0s".into()));
    let config = Config::load(args.config.as_deref(), env, &overrides)?;
    let mut engine = Engine::open(config, Place::SINGLE)?;
    let shared = engine.shared().clone();
    let limits = shared.limits.clone();
    let records = records
        .iter()
        .map(|r| operators::record::from_value(r.clone(), None, &limits).map_err(|e| anyhow::anyhow!("{e}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let turns = records.len();
    shared.queue_records(records);
    let started = Instant::now();
    engine.start(timely::Config::thread())?;
    settle(&shared, Duration::from_millis(200));
    let build_seconds = started.elapsed().as_secs_f64();
    eprintln!("ingested {turns} turns in {build_seconds:.1}s; {} questions", questions.len());
    let groupings = compare_groupings(&shared, &questions);
    let mut tally = Tally::default();
    let answering = shared.has_model();
    // A progress bar on a terminal; plain lines every 100 questions otherwise (CI logs, files).
    let bar = indicatif::ProgressBar::new(questions.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} questions ({per_sec}, eta {eta})",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    for (i, q) in questions.iter().enumerate() {
        if tty {
            bar.set_position(i as u64);
        } else if i % 100 == 0 {
            eprintln!("question {i}/{}", questions.len());
        }
        for &mode in &modes {
            for &budget in &args.budgets {
                let k = if mode == Mode::Flat { 200 } else { 10 };
                let answer = answering && q.answer.is_some();
                let req = QueryRequest {
                    query: q.text.clone(),
                    mode,
                    budget_words: Some(budget),
                    k: Some(k),
                    answer: Some(answer),
                    use_model: None,
                };
                let resp = crate::service::execute(&shared, &q.space, &req)?;
                tally.add(q, mode, budget, answer, &resp);
            }
        }
    }
    bar.finish_and_clear();
    engine.stop()?;
    tally.print(args.dataset, &modes, &args.budgets);
    let calls = answering.then(|| model_calls(&shared));
    if let Some(c) = &calls {
        print_model_calls(c);
    }
    if let Some(out) = args.out {
        let dataset = match args.dataset {
            Dataset::Locomo => "locomo",
            Dataset::Qmsum => "qmsum",
        };
        let results = tally.rows(args.dataset);
        let report = json!({"dataset": dataset, "build_seconds": build_seconds, "results": results,
            "groupings": groupings, "model_calls": calls});
        std::fs::write(&out, serde_json::to_string_pretty(&report)?)?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ExitCode::SUCCESS)
}

/// With a model: its structured calls by stage and result (`engram_llm_calls_total`), and the requests whose
/// extractive answer was logged in their place (`engram_llm_fallbacks_total`).
fn model_calls(shared: &Shared) -> Value {
    fn by_labels(vec: &prometheus::IntCounterVec, a: &str, b: Option<&str>) -> BTreeMap<String, Value> {
        let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for m in prometheus::core::Collector::collect(vec) {
            for c in m.get_metric() {
                let label = |n: &str| c.get_label().iter().find(|l| l.name() == n).map(|l| l.value().to_string());
                let inner = b.and_then(label).unwrap_or_else(|| "n".into());
                *out.entry(label(a).unwrap_or_default()).or_default().entry(inner).or_default() +=
                    c.get_counter().get_value() as u64;
            }
        }
        out.into_iter().map(|(k, v)| (k, json!(v))).collect()
    }
    json!({
        "calls": by_labels(&shared.metrics.llm.calls, "stage", Some("result")),
        "fallbacks": by_labels(&shared.metrics.llm_fallbacks, "kind", None),
    })
}

/// The model's calls as a table: per stage, how many, and the share valid, repaired, rejected or failed.
fn print_model_calls(c: &Value) {
    println!();
    println!("| stage | calls | valid | repaired | rejected | failed |");
    println!("|---|---|---|---|---|---|");
    let empty = serde_json::Map::new();
    for (stage, r) in c["calls"].as_object().unwrap_or(&empty) {
        let n = |k: &str| r[k].as_u64().unwrap_or(0);
        let total = n("valid") + n("repaired") + n("rejected") + n("failed");
        let share = |k: &str| format!("{} ({:.0} %)", n(k), 100.0 * n(k) as f64 / total.max(1) as f64);
        println!(
            "| {stage} | {total} | {} | {} | {} | {} |",
            share("valid"),
            share("repaired"),
            share("rejected"),
            share("failed")
        );
    }
    let fell: Vec<String> = c["fallbacks"]
        .as_object()
        .unwrap_or(&empty)
        .iter()
        .map(|(k, v)| format!("{k} {}", v["n"].as_u64().unwrap_or(0)))
        .collect();
    println!();
    println!(
        "requests answered extractively after `llm.max-failures`: {}",
        if fell.is_empty() { "none".into() } else { fell.join(", ") }
    );
}

/// The modes `--mode` names (all four when it names none); an unknown name is an error.
fn parse_modes(names: &[String]) -> anyhow::Result<Vec<Mode>> {
    if names.is_empty() {
        return Ok(vec![Mode::Flat, Mode::Hybrid, Mode::PruneAndGrow, Mode::Compass]);
    }
    names
        .iter()
        .map(|m| {
            serde_json::from_value(json!(m))
                .map_err(|_| anyhow::anyhow!("--mode {m:?}: expected flat, hybrid, prune-and-grow or compass"))
        })
        .collect()
}

/// Waits until the records are in (layer 0, events and the hierarchy) and no request waits for the model (for two looks in a row). A model that keeps
/// failing would leave requests waiting for ever: after a minute without progress the evaluation goes on.
pub(crate) fn settle(shared: &Shared, poll: Duration) {
    let mut quiet = 0;
    let (mut last_pending, mut progress) = (usize::MAX, Instant::now());
    loop {
        std::thread::sleep(poll);
        let settled = shared.inputs_settled().flatten().is_some_and(|e| shared.reflects(e));
        let pending = shared.views().request_count();
        quiet = if settled && pending == 0 { quiet + 1 } else { 0 };
        if quiet >= 2 {
            return;
        }
        if pending != last_pending {
            (last_pending, progress) = (pending, Instant::now());
        } else if settled && progress.elapsed() > Duration::from_secs(60) {
            eprintln!("warning: {pending} summary or segmentation requests made no progress for a minute (is the model failing?); evaluating without them");
            return;
        }
    }
}

/// (mode, budget, category).
type Cell = (&'static str, usize, String);

/// Recall and answer scores, per mode, budget and category (and `"all"`).
#[derive(Default)]
struct Tally {
    /// → (questions, recall sum).
    recall: BTreeMap<Cell, (usize, f64)>,
    /// With a model: → scores of the generated answers.
    scored: BTreeMap<Cell, Scores>,
}

impl Tally {
    fn add(&mut self, q: &Question, mode: Mode, budget: usize, answered: bool, resp: &crate::query::QueryResponse) {
        if let (true, Some(gold)) = (answered, &q.answer) {
            let predicted = resp.answer.clone().unwrap_or_default();
            if let Some(err) = &resp.answer_error {
                tracing::warn!(question = %q.text, error = %err, "no answer; scored as empty");
            }
            for cat in [q.category.to_string(), "all".to_string()] {
                let failed = resp.answer_error.is_some();
                self.scored.entry((mode.as_str(), budget, cat)).or_default().add(&predicted, gold, failed);
            }
        }
        let mut found: BTreeSet<String> = BTreeSet::new();
        for e in resp.evidence.iter().filter(|e| e.layer == 0) {
            let ids: Vec<String> = match e.source.get("nodes").and_then(Value::as_array) {
                Some(ns) => ns.iter().filter_map(|n| n.as_str().map(String::from)).collect(),
                None => vec![e.id.clone()],
            };
            found.extend(ids.iter().filter_map(|id| operators::model::split_node_id(id).map(|(_, t)| t)));
        }
        let recall = q.gold.intersection(&found).count() as f64 / q.gold.len() as f64;
        for cat in [q.category.to_string(), "all".to_string()] {
            let e = self.recall.entry((mode.as_str(), budget, cat)).or_default();
            e.0 += 1;
            e.1 += recall;
        }
    }

    /// The `--out` rows.
    fn rows(&self, dataset: Dataset) -> Vec<Value> {
        self.recall
            .iter()
            .map(|(key, (n, s))| {
                let (m, b, c) = key;
                let mut row = json!({"mode": m, "budget_words": b, "category": c, "n": n, "recall": s / *n as f64});
                if let Some(sc) = self.scored.get(key) {
                    let obj = row.as_object_mut().expect("an object");
                    obj.insert("answered".into(), json!(sc.n));
                    obj.insert("answer_errors".into(), json!(sc.errors));
                    match dataset {
                        Dataset::Locomo => {
                            obj.insert("f1".into(), json!(sc.mean(sc.f1)));
                            obj.insert("bleu1".into(), json!(sc.mean(sc.bleu1)));
                        }
                        Dataset::Qmsum => {
                            obj.insert("rouge_l".into(), json!(sc.mean(sc.rouge_l)));
                        }
                    }
                }
                row
            })
            .collect()
    }

    /// The markdown tables: recall, and with a model the answer scores.
    fn print(&self, dataset: Dataset, modes: &[Mode], budgets: &[usize]) {
        let categories: Vec<(String, &str)> = match dataset {
            Dataset::Locomo => vec![
                ("1".into(), "cat 1 multi-hop"),
                ("2".into(), "cat 2 temporal"),
                ("3".into(), "cat 3 open"),
                ("4".into(), "cat 4 single-hop"),
            ],
            Dataset::Qmsum => vec![("specific".into(), "specific"), ("general".into(), "general")],
        };
        let names = categories.iter().map(|c| c.1).collect::<Vec<_>>().join(" | ");
        let table = |head: &str, cell: &dyn Fn(Mode, usize, &str) -> String| {
            println!("| mode | budget | {head} | {names} |");
            println!("|---|---|---|{}", "---|".repeat(categories.len()));
            for &mode in modes {
                for &b in budgets {
                    let cells: Vec<String> = categories.iter().map(|c| cell(mode, b, &c.0)).collect();
                    println!("| {} | {b} | {} | {} |", mode.as_str(), cell(mode, b, "all"), cells.join(" | "));
                }
            }
        };
        table("all", &|mode, b, c| {
            self.recall
                .get(&(mode.as_str(), b, c.to_string()))
                .map_or("-".into(), |(n, s)| format!("{:.3} ({n})", s / *n as f64))
        });
        if !self.scored.is_empty() {
            let metric = match dataset {
                Dataset::Locomo => "answer F1 / BLEU-1",
                Dataset::Qmsum => "answer ROUGE-L",
            };
            println!();
            table(&format!("{metric} (all)"), &|mode, b, c| {
                self.scored.get(&(mode.as_str(), b, c.to_string())).map_or("-".into(), |sc| match dataset {
                    Dataset::Locomo => format!("{:.3} / {:.3} ({})", sc.mean(sc.f1), sc.mean(sc.bleu1), sc.n),
                    Dataset::Qmsum => format!("{:.3} ({})", sc.mean(sc.rouge_l), sc.n),
                })
            });
        }
    }
}

/// The two ways the memory groups turns, compared on the questions' evidence: CompassMem's topics (k-means over
/// events; a turn belongs to its event's topic) and CAM's layer-1 clusters (overlapping; a turn belongs to every
/// cluster that holds it). For each: how many groups and turns per group, the share of pairs of a question's gold
/// turns that share a group, and the same share over all pairs of turns of the space (what chance gives); their
/// ratio is the lift. Printed as a table and returned for the JSON output.
fn compare_groupings(shared: &Shared, questions: &[Question]) -> Value {
    use std::collections::{HashMap, HashSet};
    let views = shared.views();
    let mut out = Vec::new();
    for (name, by_topic) in [("topics (k-means over events)", true), ("CAM layer-1 clusters", false)] {
        // space → turn id (without the conversation prefix) → its groups.
        let mut member: HashMap<&str, HashMap<String, HashSet<String>>> = HashMap::new();
        let (mut groups, mut memberships) = (0usize, 0usize);
        for (space, v) in &views.spaces {
            let m = member.entry(space.as_str()).or_default();
            for id in v.nodes.keys() {
                let gs: HashSet<String> = if by_topic {
                    v.event_of.get(id.as_str()).and_then(|e| v.topic_of.get(e)).cloned().into_iter().collect()
                } else {
                    v.parents
                        .get(id.as_str())
                        .into_iter()
                        .flatten()
                        .filter(|c| v.clusters.get(c.as_str()).is_some_and(|c| c.layer == 1))
                        .map(|c| c.to_string())
                        .collect()
                };
                memberships += gs.len();
                let turn = operators::model::split_node_id(id).map_or_else(|| id.to_string(), |(_, t)| t);
                m.insert(turn, gs);
            }
            groups += if by_topic {
                v.topic_of.values().collect::<HashSet<_>>().len()
            } else {
                v.clusters.values().filter(|c| c.layer == 1).count()
            };
        }
        let shares = |m: &HashMap<String, HashSet<String>>, a: &str, b: &str| {
            m.get(a).zip(m.get(b)).is_some_and(|(x, y)| !x.is_disjoint(y))
        };
        let (mut gold_pairs, mut gold_shared) = (0usize, 0usize);
        for q in questions.iter().filter(|q| q.gold.len() >= 2) {
            let Some(m) = member.get(q.space.as_str()) else { continue };
            let gold: Vec<&String> = q.gold.iter().collect();
            for i in 0..gold.len() {
                for j in i + 1..gold.len() {
                    gold_pairs += 1;
                    gold_shared += usize::from(shares(m, gold[i], gold[j]));
                }
            }
        }
        let (mut all_pairs, mut all_shared) = (0usize, 0usize);
        for m in member.values() {
            let ids: Vec<&String> = m.keys().collect();
            for i in 0..ids.len() {
                for j in i + 1..ids.len() {
                    all_pairs += 1;
                    all_shared += usize::from(shares(m, ids[i], ids[j]));
                }
            }
        }
        let rate = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let (gold_rate, chance) = (rate(gold_shared, gold_pairs), rate(all_shared, all_pairs));
        out.push(json!({
            "grouping": name, "groups": groups, "turns_per_group": rate(memberships, groups),
            "evidence_pairs": gold_pairs, "evidence_pairs_together": gold_rate, "any_pair_together": chance,
            "lift": if chance > 0.0 { gold_rate / chance } else { 0.0 },
        }));
    }
    println!("| grouping | groups | turns per group | evidence pairs together | any pair together | lift |");
    println!("|---|---|---|---|---|---|");
    for g in &out {
        println!(
            "| {} | {} | {:.1} | {:.3} ({} pairs) | {:.3} | {:.1}× |",
            g["grouping"].as_str().unwrap_or(""),
            g["groups"],
            g["turns_per_group"].as_f64().unwrap_or(0.0),
            g["evidence_pairs_together"].as_f64().unwrap_or(0.0),
            g["evidence_pairs"],
            g["any_pair_together"].as_f64().unwrap_or(0.0),
            g["lift"].as_f64().unwrap_or(0.0),
        );
    }
    println!();
    Value::Array(out)
}

/// Sums of answer scores over questions.
#[derive(Default)]
struct Scores {
    n: usize,
    errors: usize,
    f1: f64,
    bleu1: f64,
    rouge_l: f64,
}

impl Scores {
    fn add(&mut self, predicted: &str, gold: &str, failed: bool) {
        self.n += 1;
        self.errors += usize::from(failed);
        self.f1 += crate::score::f1(predicted, gold);
        self.bleu1 += crate::score::bleu1(predicted, gold);
        self.rouge_l += crate::score::rouge_l(predicted, gold);
    }

    fn mean(&self, sum: f64) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            sum / self.n as f64
        }
    }
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("engram-eval-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
