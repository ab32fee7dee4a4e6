//! The MCP server (the official Rust SDK, `rmcp`): streamable HTTP at `/mcp` on the API port, behind the same
//! tokens as every route, its tools calling what the HTTP routes call. A tool's error is an MCP error whose message
//! is the HTTP error's, with `{"code","status"}` (the HTTP error's code and status) as its data.

use std::sync::Arc;

use rmcp::handler::server::common::Extension;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ErrorCode, Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use crate::auth::{Grant, Scope};
use crate::engine::Shared;
use crate::http::{self as api, AppError};
use crate::query::{Mode, QueryRequest};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddRecords {
    /// The space (one memory).
    pub space: String,
    /// Records, as the HTTP API takes them: `{"kind":"chunk","doc","seq","text"}`, `{"kind":"document","doc",
    /// "text"}`, `{"kind":"turn","conversation","turn","speaker","text"}`, `{"kind":"delete","doc"|"conversation"}`.
    pub records: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Search {
    pub space: String,
    /// The question.
    pub query: String,
    /// compass (default) | prune-and-grow | hybrid | flat
    pub mode: Option<String>,
    /// Words of evidence (default `query.default-budget-words`).
    pub budget_words: Option<usize>,
    pub k: Option<usize>,
    /// Wait until the memory holds this receipt (what `add_records` returned) or Kafka position.
    pub after: Option<String>,
    /// Have the model answer from the evidence (default: whenever one is configured).
    pub answer: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetNode {
    pub space: String,
    /// A chunk or turn id (`doc#seq`, `conversation#turn`), a cluster (`L1:…`), an event (`E:…`) or a topic (`T:…`).
    pub id: String,
    pub after: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSpaces {}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Delete {
    pub space: String,
    /// The document to delete (or use `conversation`).
    pub doc: Option<String>,
    /// The conversation to delete (or use `doc`).
    pub conversation: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Events {
    pub space: String,
    /// Only this conversation's events (default: every event of the space).
    pub conversation: Option<String>,
    pub after: Option<String>,
}

/// The MCP tools over one engine.
#[derive(Clone)]
pub struct EngramMcp {
    shared: Arc<Shared>,
    tool_router: ToolRouter<Self>,
}

/// An HTTP error as an MCP error: the message, and `{"code","status"}`.
fn mcp_error(e: AppError) -> ErrorData {
    let kind = if e.status.is_client_error() { ErrorCode::INVALID_PARAMS } else { ErrorCode::INTERNAL_ERROR };
    ErrorData::new(kind, e.message, Some(json!({"code": e.code, "status": e.status.as_u16()})))
}

fn ok(v: serde_json::Value) -> Result<CallToolResult, ErrorData> {
    Ok(CallToolResult::success(vec![ContentBlock::text(v.to_string())]))
}

/// The grant the API's authentication gave this request (absent: the request did not come through it).
fn grant(parts: &::http::request::Parts) -> Result<Grant, ErrorData> {
    parts
        .extensions
        .get::<Grant>()
        .cloned()
        .ok_or_else(|| ErrorData::new(ErrorCode::INTERNAL_ERROR, "the request was not authenticated", None))
}

fn allowed(parts: &::http::request::Parts, need: Scope, space: &str) -> Result<Grant, ErrorData> {
    let g = grant(parts)?;
    api::check_space(space).map_err(mcp_error)?;
    g.require(need, space).map_err(|e| mcp_error(e.into()))?;
    Ok(g)
}

#[tool_router]
impl EngramMcp {
    pub fn new(shared: Arc<Shared>) -> Self {
        EngramMcp { shared, tool_router: Self::tool_router() }
    }

    #[tool(description = "Add records (chunks, documents, conversation turns, deletes) to a space. Returns at once \
                          with a receipt: pass it as `after` to search to read what was just added.")]
    async fn add_records(
        &self,
        Extension(parts): Extension<::http::request::Parts>,
        Parameters(p): Parameters<AddRecords>,
    ) -> Result<CallToolResult, ErrorData> {
        let g = allowed(&parts, Scope::Write, &p.space)?;
        let raws = p.records.into_iter().map(Ok).collect();
        ok(api::ingest_raws(self.shared.clone(), g, p.space, raws).await.map_err(mcp_error)?)
    }

    #[tool(description = "Search a space's memory: evidence (ids, text, scores, sources) ranked by the mode, within \
                          a word budget, with the retrieval's trace; with a model configured, also its answer.")]
    async fn search(
        &self,
        Extension(parts): Extension<::http::request::Parts>,
        Parameters(p): Parameters<Search>,
    ) -> Result<CallToolResult, ErrorData> {
        allowed(&parts, Scope::Read, &p.space)?;
        let mode: Mode = match &p.mode {
            None => Mode::DEFAULT,
            Some(m) => serde_json::from_value(json!(m)).map_err(|_| {
                mcp_error(AppError::bad_request(format!(
                    "mode {m:?}: expected compass, prune-and-grow, hybrid or flat"
                )))
            })?,
        };
        let req = QueryRequest {
            query: p.query,
            mode,
            budget_words: p.budget_words,
            k: p.k,
            answer: p.answer,
            use_model: None,
        };
        let resp = api::run_query(self.shared.clone(), p.space, req, p.after).await.map_err(mcp_error)?;
        ok(serde_json::to_value(resp).unwrap_or_default())
    }

    #[tool(description = "Read one node of a space: a chunk or turn (text, source, neighbours, parent clusters), a \
                          cluster (summary, children, parents), an event (summary, turns, people, time, relations, \
                          merge group, topic) or a topic (its events).")]
    async fn get_node(
        &self,
        Extension(parts): Extension<::http::request::Parts>,
        Parameters(p): Parameters<GetNode>,
    ) -> Result<CallToolResult, ErrorData> {
        allowed(&parts, Scope::Read, &p.space)?;
        api::wait_for(&self.shared, p.after.as_deref()).await.map_err(mcp_error)?;
        ok(api::node_json(&self.shared, &p.space, &p.id).map_err(mcp_error)?)
    }

    #[tool(description = "List the spaces this token may read, with their statistics (nodes, edges, layers, \
                          clusters, pending summaries, events, relations, topics).")]
    async fn list_spaces(
        &self,
        Extension(parts): Extension<::http::request::Parts>,
        Parameters(_): Parameters<ListSpaces>,
    ) -> Result<CallToolResult, ErrorData> {
        let g = grant(&parts)?;
        ok(api::spaces_json(&self.shared, &g))
    }

    #[tool(description = "Delete a document or a conversation from a space, and everything derived from it. \
                          Returns a receipt.")]
    async fn delete(
        &self,
        Extension(parts): Extension<::http::request::Parts>,
        Parameters(p): Parameters<Delete>,
    ) -> Result<CallToolResult, ErrorData> {
        let g = allowed(&parts, Scope::Write, &p.space)?;
        let record = match (p.doc, p.conversation) {
            (Some(d), None) => json!({"kind": "delete", "doc": d}),
            (None, Some(c)) => json!({"kind": "delete", "conversation": c}),
            _ => return Err(mcp_error(AppError::bad_request("name exactly one of `doc` and `conversation`"))),
        };
        let out = api::ingest_raws(self.shared.clone(), g, p.space, vec![Ok(record)]).await.map_err(mcp_error)?;
        if out["accepted"] == 0 {
            let reason = out["rejected"][0]["reason"].as_str().unwrap_or("rejected").to_string();
            return Err(mcp_error(AppError::bad_request(reason)));
        }
        ok(out)
    }

    #[tool(description = "The event memory of a space (or of one conversation): events with their turns, people, \
                          time, merge group and topic, and the typed relations between them.")]
    async fn get_events(
        &self,
        Extension(parts): Extension<::http::request::Parts>,
        Parameters(p): Parameters<Events>,
    ) -> Result<CallToolResult, ErrorData> {
        allowed(&parts, Scope::Read, &p.space)?;
        api::wait_for(&self.shared, p.after.as_deref()).await.map_err(mcp_error)?;
        ok(api::events_json(&self.shared, &p.space, p.conversation.as_deref()).map_err(mcp_error)?)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for EngramMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("engram", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "engram: a streaming memory of documents and conversations. add_records writes (and returns a \
             receipt), search reads (pass the receipt as `after` to read your writes), get_node and get_events \
             follow the memory's links, list_spaces shows what there is.",
            )
    }
}

/// The `/mcp` service: stateless streamable HTTP with JSON responses, hosts allowed by `mcp.allowed-hosts`.
pub fn service(shared: Arc<Shared>) -> StreamableHttpService<EngramMcp, LocalSessionManager> {
    let hosts = shared.config.mcp.allowed_hosts.clone();
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(shared.config.ingest.max_body_bytes)
        .with_allowed_hosts(hosts);
    StreamableHttpService::new(move || Ok(EngramMcp::new(shared.clone())), Default::default(), config)
}

/// `engram mcp --url URL`: MCP over stdio for a desktop client, relayed to a running engine's `/mcp` — each
/// JSON-RPC message read from stdin (one per line) is POSTed with the token, and each reply (a JSON body, or the
/// `data:` lines of an event stream) is written to stdout, one per line. Notifications get no reply.
pub async fn stdio_relay(url: &str, token: Option<&str>) -> anyhow::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let endpoint = format!("{}/mcp", url.trim_end_matches('/'));
    let client = reqwest::Client::builder().build()?;
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        let id = serde_json::from_str::<serde_json::Value>(&line).ok().and_then(|v| v.get("id").cloned());
        let mut req = client
            .post(&endpoint)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(line);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let replies: Vec<String> = match req.send().await {
            Ok(r) => {
                let status = r.status();
                let sse = r.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
                let body = r.text().await.unwrap_or_default();
                if sse {
                    body.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.trim().to_string()).filter(|d| !d.is_empty()).collect()
                } else if body.trim().starts_with('{') {
                    vec![body.trim().to_string()]
                } else if !status.is_success() {
                    // Refused before MCP (a missing token, a body over the limit): an error for the request's id.
                    let message = serde_json::from_str::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                        .unwrap_or_else(|| format!("HTTP {status}"));
                    id.iter().map(|id| json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32001, "message": message}}).to_string()).collect()
                } else {
                    Vec::new()
                }
            }
            Err(e) => id
                .iter()
                .map(|id| {
                    json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32002, "message": format!("cannot reach {endpoint}: {e}")}})
                        .to_string()
                })
                .collect(),
        };
        for r in replies {
            out.write_all(r.as_bytes()).await?;
            out.write_all(b"\n").await?;
        }
        out.flush().await?;
    }
    Ok(())
}

/// In front of `/mcp`: a POST whose body is not one JSON-RPC message from a client (`null`, a bare number, a batch,
/// an object of the wrong shape) is answered 400 with a JSON-RPC parse error, and never reaches the SDK's transport.
pub async fn check_message(req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    use axum::response::IntoResponse;
    if req.method() != ::http::Method::POST {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let limit = parts.extensions.get::<BodyLimit>().map_or(usize::MAX, |l| l.0);
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            let status = ::http::StatusCode::PAYLOAD_TOO_LARGE;
            return (status, axum::Json(rpc_error(-32700, &format!("could not read the body: {e}")))).into_response();
        }
    };
    let valid = serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|e| e.to_string()).and_then(|v| {
        if !v.is_object() || v.get("jsonrpc").and_then(|j| j.as_str()) != Some("2.0") {
            return Err("not a JSON-RPC 2.0 message object".to_string());
        }
        serde_json::from_value::<rmcp::model::ClientJsonRpcMessage>(v).map(|_| ()).map_err(|e| e.to_string())
    });
    if let Err(why) = valid {
        let status = ::http::StatusCode::BAD_REQUEST;
        return (status, axum::Json(rpc_error(-32700, &format!("not an MCP message: {why}")))).into_response();
    }
    next.run(axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

/// The largest `/mcp` body (`ingest.max-body-bytes`), for [`check_message`].
#[derive(Clone, Copy)]
pub struct BodyLimit(pub usize);

fn rpc_error(code: i64, message: &str) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}})
}
