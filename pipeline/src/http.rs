//! The HTTP API and the admin server (/metrics, /healthz).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use operators::request::ModelRequest;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::auth::{Forbidden, Grant, Scope, Unauthenticated};
use crate::engine::{IngestError, Shared};
use crate::query::{self, QueryRequest, QueryResponse};
use crate::service::{self, QueryError};

/// Every error the API returns: a status and `{"error":{"code","message"}}`.
#[derive(Debug)]
pub struct AppError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl AppError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        AppError { status, code, message: message.into() }
    }
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
}

/// The body of every API error.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// A stable code: `bad_request`, `unauthorized`, `forbidden`, `unknown_space`, `overloaded`, …
    pub code: String,
    pub message: String,
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let body = ErrorBody { error: ErrorDetail { code: self.code.to_string(), message: self.message } };
        (self.status, Json(body)).into_response()
    }
}

impl From<IngestError> for AppError {
    fn from(e: IngestError) -> Self {
        match e {
            IngestError::Overloaded(_) => AppError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", e.to_string()),
            IngestError::Log(_) => {
                AppError::new(StatusCode::SERVICE_UNAVAILABLE, "input_log", format!("{e}; nothing was taken, retry"))
            }
            IngestError::SpaceQuota(_) => AppError::new(StatusCode::FORBIDDEN, "space_quota", e.to_string()),
        }
    }
}

impl From<Forbidden> for AppError {
    fn from(e: Forbidden) -> Self {
        AppError::new(StatusCode::FORBIDDEN, "forbidden", e.to_string())
    }
}

/// Authenticates every API request: the grant its token gives goes with it, or it is answered 401.
async fn authenticate(State(s): State<Arc<Shared>>, mut req: Request, next: Next) -> Response {
    if req.uri().path() == "/browse" {
        // The browser's page is static (no memory in it): it asks the API with the token its user types.
        return next.run(req).await;
    }
    let header = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    match s.access.authenticate(header) {
        Ok(grant) => {
            req.extensions_mut().insert(grant);
            next.run(req).await
        }
        Err(e) => {
            s.metrics.unauthorized.inc();
            let code = if e == Unauthenticated::Missing { "unauthorized" } else { "bad_token" };
            let mut r = AppError::new(StatusCode::UNAUTHORIZED, code, e.to_string()).into_response();
            r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
            r
        }
    }
}

impl From<QueryError> for AppError {
    fn from(e: QueryError) -> Self {
        let status = match e {
            QueryError::BadRequest(_) => StatusCode::BAD_REQUEST,
            QueryError::UnknownSpace(_) => StatusCode::NOT_FOUND,
        };
        AppError::new(status, e.code(), e.to_string())
    }
}

/// The API's routes and their OpenAPI document, from one table: a route cannot be served without being documented.
pub fn routes() -> (Router<Arc<Shared>>, utoipa::openapi::OpenApi) {
    use utoipa::OpenApi;
    use utoipa_axum::{router::OpenApiRouter, routes};
    OpenApiRouter::with_openapi(crate::openapi::ApiDoc::openapi())
        .routes(routes!(api_healthz))
        .routes(routes!(spaces))
        .routes(routes!(errors))
        .routes(routes!(ingest))
        .routes(routes!(query_space))
        .routes(routes!(node))
        .routes(routes!(pending_summaries))
        .routes(routes!(events))
        .routes(routes!(layer))
        .split_for_parts()
}

/// The API's OpenAPI 3.1 document (served at `/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    crate::openapi::finish(routes().1)
}

pub fn api(shared: Arc<Shared>) -> Router {
    let limit = shared.config.ingest.max_body_bytes;
    let (timeout, concurrent) = (shared.config.http.request_timeout, shared.config.http.max_concurrent_requests);
    let (router, doc) = routes();
    let doc = Arc::new(crate::openapi::finish(doc));
    router
        .route("/openapi.json", get(move || async move { Json(doc.as_ref().clone()) }))
        .route("/browse", get(browser))
        .fallback(|| async { AppError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            AppError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this route does not take that method")
        })
        .merge(
            Router::new()
                .nest_service("/mcp", crate::mcp::service(shared.clone()))
                .layer(axum::middleware::from_fn(crate::mcp::check_message))
                .layer(axum::Extension(crate::mcp::BodyLimit(limit))),
        )
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(shared.clone(), authenticate))
        .layer(
            tower::ServiceBuilder::new()
                .layer(axum::error_handling::HandleErrorLayer::new(move |_: tower::BoxError| async move {
                    let message = format!("the request took longer than http.request-timeout = {timeout:?}");
                    AppError::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", message)
                }))
                .layer(tower::timeout::TimeoutLayer::new(timeout)),
        )
        .layer(tower::limit::ConcurrencyLimitLayer::new(concurrent))
        .with_state(shared)
}

pub fn admin(shared: Arc<Shared>) -> Router {
    Router::new().route("/healthz", get(healthz)).route("/metrics", get(metrics)).with_state(shared)
}

async fn healthz(State(s): State<Arc<Shared>>) -> Response {
    // The hierarchy first: it never passes layer 0, which may move on between the two reads.
    let hierarchy_as_of = s.hierarchy_as_of();
    let as_of = s.as_of();
    match s.failure() {
        None => Json(json!({"status": "ok", "as_of": as_of, "hierarchy_as_of": hierarchy_as_of})).into_response(),
        Some(reason) => {
            let body =
                json!({"status": "failed", "reason": reason, "as_of": as_of, "hierarchy_as_of": hierarchy_as_of});
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}

/// The memory browser: one page (HTML, CSS and script in the binary), which reads the memory through this API.
async fn browser() -> Response {
    const PAGE: &str = include_str!("browser/index.html");
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
        .into_response()
}

/// The API port's health: any valid token may ask (the admin port's needs none).
#[utoipa::path(get, path = "/healthz", tag = "engine",
    responses((status = 200, description = "the engine runs", body = crate::openapi::Health),
              (status = 503, description = "a worker, the summariser or a model thread died", body = crate::openapi::Health), (status = 401, description = "no token, or an unknown one", body = ErrorBody), (status = 403, description = "the token does not reach the space", body = ErrorBody)))]
async fn api_healthz(state: State<Arc<Shared>>, Extension(grant): Extension<Grant>) -> Response {
    if !grant.has(Scope::Read) {
        return AppError::new(StatusCode::FORBIDDEN, "forbidden", "no scope").into_response();
    }
    healthz(state).await
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render()).into_response()
}

/// The spaces the token may read, with their statistics.
#[utoipa::path(get, path = "/v1/spaces", tag = "memory",
    responses((status = 200, description = "the spaces the token may read", body = crate::openapi::Spaces), (status = 401, description = "no token, or an unknown one", body = ErrorBody), (status = 403, description = "the token does not reach the space", body = ErrorBody)))]
async fn spaces(State(s): State<Arc<Shared>>, Extension(grant): Extension<Grant>) -> Json<serde_json::Value> {
    Json(spaces_json(&s, &grant))
}

/// `{"spaces":[…],"as_of","hierarchy_as_of"}`: the spaces `grant` may read.
pub(crate) fn spaces_json(s: &Shared, grant: &Grant) -> serde_json::Value {
    let views = s.views();
    let spaces = views
        .spaces
        .iter()
        .filter(|(name, _)| grant.allows(Scope::Read, name))
        .map(|(name, v)| crate::openapi::SpaceStats {
            space: name.clone(),
            nodes: v.nodes.len(),
            edges: v.edges,
            layers: v.layer_counts(),
            clusters: v.clusters.len(),
            summaries_pending: v.requests.len(),
            events: v.events.len(),
            relations: v.relations.len(),
            merged_events: v.groups.iter().filter(|(e, g)| e != g).count(),
            topics: v.topic_of.values().collect::<std::collections::HashSet<_>>().len(),
            as_of: views.as_of,
            hierarchy_as_of: views.hierarchy_as_of,
        })
        .collect();
    let (as_of, hierarchy_as_of) = (views.as_of, views.hierarchy_as_of);
    serde_json::to_value(crate::openapi::Spaces { spaces, as_of, hierarchy_as_of }).unwrap_or_default()
}

/// Rejected inputs (admin scope): those of the token's spaces; a token over every space also sees the ones no space
/// could be read from. `total` counts every reject; `recent` lists the last ones the token may see.
#[utoipa::path(get, path = "/v1/errors", tag = "engine",
    responses((status = 200, description = "rejected inputs of the token's spaces (admin scope)", body = crate::openapi::Errors), (status = 401, description = "no token, or an unknown one", body = ErrorBody), (status = 403, description = "the token does not reach the space", body = ErrorBody)))]
async fn errors(
    State(s): State<Arc<Shared>>,
    Extension(grant): Extension<Grant>,
) -> Result<Json<serde_json::Value>, AppError> {
    if !grant.has(Scope::Admin) {
        return Err(AppError::new(StatusCode::FORBIDDEN, "forbidden", "/v1/errors needs a token with the admin scope"));
    }
    let views = s.views();
    let recent: Vec<_> = views
        .recent_errors
        .iter()
        .filter(|e| match &e.space {
            Some(space) => grant.allows(Scope::Admin, space),
            None => grant.sees_unowned(),
        })
        .collect();
    let total = if grant.sees_unowned() { Some(views.errors_total) } else { None };
    Ok(Json(json!({"total": total, "recent": recent})))
}

pub(crate) fn check_space(space: &str) -> Result<(), AppError> {
    let ok = !space.is_empty()
        && space.len() <= 128
        && space.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(AppError::bad_request(format!("invalid space name `{space}`: use ASCII letters, digits, '-', '_', '.'")))
    }
}

/// `POST /v1/spaces/{space}/records`: a JSON array of records, or NDJSON (one record per line).
#[utoipa::path(post, path = "/v1/spaces/{space}/records", tag = "memory", params(("space" = String, Path, description = "the space: ASCII letters, digits, `-`, `_`, `.`")),
    request_body(content = String, description = "NDJSON (one record per line) or a JSON array of records", content_type = "application/x-ndjson"),
    responses((status = 200, description = "the receipt: the accepted records are logged and fsync'd", body = crate::openapi::IngestResponse),
              (status = 400, description = "a body that is neither NDJSON nor a JSON array", body = ErrorBody),
              (status = 413, description = "over ingest.max-body-bytes or ingest.max-records-per-request", body = ErrorBody),
              (status = 503, description = "the queue is at a cap, or the input log failed", body = ErrorBody), (status = 401, description = "no token, or an unknown one", body = ErrorBody), (status = 403, description = "the token does not reach the space", body = ErrorBody)))]
async fn ingest(
    State(s): State<Arc<Shared>>,
    Extension(grant): Extension<Grant>,
    Path(space): Path<String>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Response, AppError> {
    check_space(&space)?;
    grant.require(Scope::Write, &space)?;
    let body = read_body(body, &headers, s.config.ingest.max_body_bytes).await?;
    let trimmed = body.trim_ascii_start();
    let max = s.config.ingest.max_records_per_request;
    let too_many = || too_many_records(max);
    let raws: Vec<Result<serde_json::Value, (Vec<u8>, String)>> = if trimmed.first() == Some(&b'[') {
        let mut de = serde_json::Deserializer::from_slice(trimmed);
        let values = serde::de::DeserializeSeed::deserialize(Capped(max), &mut de).and_then(|v| de.end().map(|()| v));
        match values {
            Ok(values) => values.into_iter().map(Ok).collect(),
            Err(e) if e.to_string().starts_with(TOO_MANY) => return Err(too_many()),
            Err(e) => return Err(AppError::bad_request(format!("body starts with '[' but is not a JSON array: {e}"))),
        }
    } else {
        let lines: Vec<&[u8]> =
            trimmed.split(|b| *b == b'\n').filter(|l| !l.iter().all(u8::is_ascii_whitespace)).collect();
        if lines.len() > max {
            return Err(too_many());
        }
        lines
            .into_iter()
            .map(|line| operators::record::parse_json(line, &s.limits).map_err(|e| (line.to_vec(), e.to_string())))
            .collect()
    };
    Ok(Json(ingest_raws(s, grant, space, raws).await?).into_response())
}

/// 413 for a request over `ingest.max-records-per-request`: nothing of it is taken.
fn too_many_records(max: usize) -> AppError {
    AppError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_many_records",
        format!("more than ingest.max-records-per-request = {max} records in one request; nothing was taken"),
    )
}

/// Takes parsed records (or their parse errors) into `space` for `grant` (whose `Write` scope the caller checked):
/// `{"receipt","accepted","rejected","rejected_total"}`.
pub(crate) async fn ingest_raws(
    s: Arc<Shared>,
    grant: Grant,
    space: String,
    raws: Vec<Result<serde_json::Value, (Vec<u8>, String)>>,
) -> Result<serde_json::Value, AppError> {
    if let Some(reason) = s.failure() {
        return Err(AppError::new(StatusCode::SERVICE_UNAVAILABLE, "engine_failed", reason));
    }
    if raws.is_empty() {
        return Err(AppError::bad_request("no records in the body"));
    }
    let max = s.config.ingest.max_records_per_request;
    if raws.len() > max {
        return Err(too_many_records(max));
    }
    let receipt = tokio::task::spawn_blocking(move || s.ingest_http(&space, raws, grant.quota()))
        .await
        .map_err(|e| AppError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))??;
    let body = crate::openapi::IngestResponse {
        receipt: receipt.epoch.map(|e| e.to_string()),
        accepted: receipt.accepted,
        rejected: receipt
            .rejected
            .into_iter()
            .map(|(index, reason)| crate::openapi::Rejected { index, reason })
            .collect(),
        rejected_total: receipt.rejected_total,
    };
    Ok(serde_json::to_value(body).unwrap_or_default())
}

/// Reads a body of at most `limit` bytes into one buffer sized from its `Content-Length` up front, so that a large
/// body takes its own size in memory once (collecting chunks and then joining them takes twice).
async fn read_body(body: Body, headers: &axum::http::HeaderMap, limit: usize) -> Result<Vec<u8>, AppError> {
    use http_body_util::BodyExt;
    let too_large = || {
        AppError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the body is larger than ingest.max-body-bytes = {limit}"),
        )
    };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut buf = Vec::with_capacity(declared.unwrap_or(0));
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| AppError::bad_request(format!("could not read the body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(too_large());
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf)
}

/// How a capped array says it was cut (the start of its error message).
const TOO_MANY: &str = "too many records";

/// A JSON array of at most `.0` values: past it, an error starting [`TOO_MANY`], and the rest is never parsed.
struct Capped(usize);

impl<'de> serde::de::DeserializeSeed<'de> for Capped {
    type Value = Vec<serde_json::Value>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Capped {
    type Value = Vec<serde_json::Value>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "a JSON array of at most {} records", self.0)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<serde_json::Value>()? {
            if out.len() == self.0 {
                return Err(serde::de::Error::custom(TOO_MANY));
            }
            out.push(v);
        }
        Ok(out)
    }
}

#[derive(Deserialize)]
struct AfterParam {
    after: Option<String>,
}

/// `TOPIC:PARTITION:OFFSET` → (`kafka:TOPIC/PARTITION`, offset).
fn parse_kafka_position(after: &str) -> Option<(String, u64)> {
    let (rest, offset) = after.rsplit_once(':')?;
    let (topic, partition) = rest.rsplit_once(':')?;
    let partition: u32 = partition.parse().ok()?;
    let offset: u64 = offset.parse().ok()?;
    if topic.is_empty() {
        return None;
    }
    Some((format!("kafka:{topic}/{partition}"), offset))
}

/// Waits until the views include `after` — a receipt (an epoch number) or a Kafka position
/// `TOPIC:PARTITION:OFFSET` (read by whichever process holds the partition, then reflected) — up to
/// `query.max-wait`.
pub(crate) async fn wait_for(s: &Shared, after: Option<&str>) -> Result<(), AppError> {
    let Some(after) = after else { return Ok(()) };
    let wait = s.config.query.max_wait;
    let mut rx = s.watch_as_of();
    let (reached, what) = match after.trim().parse::<u64>() {
        Ok(epoch) => {
            if !s.receipt_issued(epoch) {
                return Err(AppError::new(
                    StatusCode::BAD_REQUEST,
                    "unknown_receipt",
                    format!("receipt {epoch} was never handed out (ingest returns receipts)"),
                ));
            }
            let reached =
                tokio::time::timeout(wait, rx.wait_for(|a| a.is_some_and(|a| a >= epoch))).await.map(|r| r.is_ok());
            (reached, format!("receipt {epoch}"))
        }
        Err(_) => {
            let (source, offset) = parse_kafka_position(after.trim()).ok_or_else(|| {
                AppError::bad_request(format!(
                    "after={after:?} is neither a receipt (an epoch number, as ingest returns it) nor a Kafka position TOPIC:PARTITION:OFFSET"
                ))
            })?;
            // Positions change only with the views' as-of, so waking on it is enough.
            let holds = || s.views().holds(&source, offset);
            let reached = tokio::time::timeout(wait, rx.wait_for(|_| holds())).await.map(|r| r.is_ok());
            (reached, format!("offset {offset} of {source}"))
        }
    };
    waited(reached, || format!("the views did not reach {what} within {wait:?} (as of {:?})", s.as_of()))
}

/// A wait's outcome as the API answers it: reached, the engine stopping (503), or `query.max-wait` passed (504,
/// with `timeout`'s message).
fn waited<E>(reached: Result<bool, E>, timeout: impl FnOnce() -> String) -> Result<(), AppError> {
    match reached {
        Ok(true) => Ok(()),
        Ok(false) => Err(AppError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", "the engine is stopping")),
        Err(_) => Err(AppError::new(StatusCode::GATEWAY_TIMEOUT, "timeout", timeout())),
    }
}

/// [`wait_for`], then until the hierarchy (which follows layer 0 on a thread of its own) holds what layer 0 then
/// does, within the same `query.max-wait`.
pub(crate) async fn wait_for_hierarchy(s: &Shared, after: Option<&str>) -> Result<(), AppError> {
    if after.is_none() {
        return Ok(());
    }
    let started = std::time::Instant::now();
    wait_for(s, after).await?;
    let Some(epoch) = s.as_of() else { return Ok(()) };
    let wait = s.config.query.max_wait.saturating_sub(started.elapsed());
    let mut rx = s.watch_hierarchy_as_of();
    let reached = tokio::time::timeout(wait, rx.wait_for(|h| h.is_some_and(|h| h >= epoch))).await.map(|r| r.is_ok());
    waited(reached, || {
        let (max, at) = (s.config.query.max_wait, s.hierarchy_as_of());
        format!("the hierarchy did not reach epoch {epoch} within {max:?} (as of {at:?})")
    })
}

#[utoipa::path(post, path = "/v1/spaces/{space}/query", tag = "memory", params(("space" = String, Path, description = "the space: ASCII letters, digits, `-`, `_`, `.`"), ("after" = Option<String>, Query, description = "wait until the views hold this receipt or Kafka position TOPIC:PARTITION:OFFSET")),
    request_body = QueryRequest,
    responses((status = 200, description = "evidence within the budget, the trace, and with a model the answer", body = QueryResponse),
              (status = 400, description = "an invalid query (empty, too long, k or budget out of range, too many subgoals)", body = ErrorBody),
              (status = 404, description = "no such space", body = ErrorBody),
              (status = 504, description = "the views did not reach `after` within query.max-wait", body = ErrorBody), (status = 401, description = "no token, or an unknown one", body = ErrorBody), (status = 403, description = "the token does not reach the space", body = ErrorBody)))]
async fn query_space(
    State(s): State<Arc<Shared>>,
    Extension(grant): Extension<Grant>,
    Path(space): Path<String>,
    Query(params): Query<AfterParam>,
    body: Bytes,
) -> Result<Json<QueryResponse>, AppError> {
    check_space(&space)?;
    grant.require(Scope::Read, &space)?;
    let req: QueryRequest =
        serde_json::from_slice(&body).map_err(|e| AppError::bad_request(format!("invalid query body: {e}")))?;
    Ok(Json(run_query(s, space, req, params.after).await?))
}

/// Validates a query, waits for `after`, and answers it off the async runtime (the caller checked the scope).
pub(crate) async fn run_query(
    s: Arc<Shared>,
    space: String,
    req: QueryRequest,
    after: Option<String>,
) -> Result<QueryResponse, AppError> {
    service::validate(&s, &req)?;
    wait_for(&s, after.as_deref()).await?;
    let response = tokio::task::spawn_blocking(move || service::execute(&s, &space, &req))
        .await
        .map_err(|e| AppError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))??;
    Ok(response)
}

#[utoipa::path(get, path = "/v1/spaces/{space}/nodes/{id}", tag = "memory",
    params(("space" = String, Path, description = "the space: ASCII letters, digits, `-`, `_`, `.`"), ("id" = String, Path, description = "a chunk or turn id, a cluster `L<layer>:…`, an event `E:…` or a topic `T:…`"), ("after" = Option<String>, Query, description = "wait until the views, their hierarchy included, hold this receipt or Kafka position TOPIC:PARTITION:OFFSET")),
    responses((status = 200, description = "the node with its links (fields by kind)", body = serde_json::Value),
              (status = 404, description = "no such space or node", body = ErrorBody), (status = 401, description = "no token, or an unknown one", body = ErrorBody), (status = 403, description = "the token does not reach the space", body = ErrorBody)))]
async fn node(
    State(s): State<Arc<Shared>>,
    Extension(grant): Extension<Grant>,
    Path((space, id)): Path<(String, String)>,
    Query(params): Query<AfterParam>,
) -> Result<Json<serde_json::Value>, AppError> {
    grant.require(Scope::Read, &space)?;
    // A node's parents and a cluster's members are the hierarchy's.
    wait_for_hierarchy(&s, params.after.as_deref()).await?;
    Ok(Json(node_json(&s, &space, &id)?))
}

/// A node of any kind (chunk or turn, cluster, event, topic) with its links.
pub(crate) fn node_json(s: &Shared, space: &str, id: &str) -> Result<serde_json::Value, AppError> {
    let id = id.to_string();
    let views = s.views();
    let view = space_view(&views, space)?;
    let mut neighbours: Vec<(String, u32)> = view
        .adjacency
        .get(id.as_str())
        .map(|m| m.iter().map(|(v, w)| (v.to_string(), *w)).collect())
        .unwrap_or_default();
    neighbours.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let parents: Vec<&str> =
        view.parents.get(id.as_str()).map(|p| p.iter().map(|c| c.as_str()).collect()).unwrap_or_default();
    if let Some((n, _)) = view.nodes.get(id.as_str()) {
        return Ok(json!({
            "id": n.id, "layer": 0, "kind": n.kind, "text": n.text, "source": query::source_of(n),
            "neighbours": neighbours.iter().map(|(v, w)| json!({"id": v, "weight": *w as f64 / 1e6})).collect::<Vec<_>>(),
            "children": [], "parents": parents, "as_of": views.as_of,
        }));
    }
    if let Some(e) = view.events.get(&id) {
        let rels: Vec<_> = view
            .related
            .get(&id)
            .into_iter()
            .flatten()
            .map(|r| json!({"from": r.from, "to": r.to, "kind": r.kind, "evidence": r.evidence}))
            .collect();
        // A merged event keeps every member's summary, turns, people and time.
        let group = view.groups.get(&id).unwrap_or(&id);
        let merged: Vec<_> = view
            .groups
            .iter()
            .filter(|(other, g)| *g == group && **other != id)
            .filter_map(|(other, _)| view.events.get(other))
            .map(|o| {
                json!({"id": o.id, "summary": o.summary, "conversation": o.conversation, "session": o.session,
                            "turns": o.turns, "people": o.people, "time": o.time})
            })
            .collect();
        return Ok(json!({
            "id": e.id, "layer": 0, "kind": "event", "text": e.summary,
            "source": {"conversation": e.conversation, "session": e.session, "turns": e.turns, "people": e.people, "time": e.time},
            "relations": rels, "group": group, "merged": merged, "topic": view.topic_of.get(&id), "as_of": views.as_of,
        }));
    }
    let members: Vec<&String> = view.topic_of.iter().filter(|(_, t)| **t == id).map(|(e, _)| e).collect();
    if !members.is_empty() {
        // A topic (CompassMem): its member events, and as text the summaries of the first few.
        let mut members = members;
        members.sort();
        let text: Vec<&str> =
            members.iter().filter_map(|e| view.events.get(*e)).take(3).map(|e| e.summary.as_str()).collect();
        return Ok(json!({
            "id": id, "layer": 0, "kind": "topic", "text": text.join(" / "), "children": members, "as_of": views.as_of,
        }));
    }
    let c = view
        .clusters
        .get(&id)
        .ok_or_else(|| AppError::new(StatusCode::NOT_FOUND, "unknown_node", format!("no node `{id}` in `{space}`")))?;
    Ok(json!({
        "id": id, "layer": c.layer, "kind": "summary", "text": c.summary.as_ref().map(|s| &s.0),
        "neighbours": neighbours.iter().map(|(v, w)| json!({"id": v, "weight": w})).collect::<Vec<_>>(),
        "children": c.members, "parents": parents, "as_of": views.as_of,
    }))
}

/// A space's views, or `404 unknown_space`.
fn space_view<'a>(views: &'a crate::views::Views, space: &str) -> Result<&'a crate::views::SpaceView, AppError> {
    views
        .spaces
        .get(space)
        .ok_or_else(|| AppError::new(StatusCode::NOT_FOUND, "unknown_space", format!("no space `{space}`")))
}

/// The event memory of a space: events in (conversation, session, time) order and their relations.
#[utoipa::path(get, path = "/v1/spaces/{space}/events", tag = "memory", params(("space" = String, Path, description = "the space: ASCII letters, digits, `-`, `_`, `.`"), ("after" = Option<String>, Query, description = "wait until the views hold this receipt or Kafka position TOPIC:PARTITION:OFFSET")),
    responses((status = 200, description = "events in (conversation, session, time) order, and their typed relations", body = serde_json::Value),
              (status = 404, description = "no such space", body = ErrorBody), (status = 401, description = "no token, or an unknown one", body = ErrorBody), (status = 403, description = "the token does not reach the space", body = ErrorBody)))]
async fn events(
    State(s): State<Arc<Shared>>,
    Extension(grant): Extension<Grant>,
    Path(space): Path<String>,
    Query(params): Query<AfterParam>,
) -> Result<Json<serde_json::Value>, AppError> {
    grant.require(Scope::Read, &space)?;
    wait_for(&s, params.after.as_deref()).await?;
    Ok(Json(events_json(&s, &space, None)?))
}

/// The event memory of a space (of one conversation, when given): `{"events","relations","as_of"}`.
pub(crate) fn events_json(s: &Shared, space: &str, conversation: Option<&str>) -> Result<serde_json::Value, AppError> {
    let views = s.views();
    let view = space_view(&views, space)?;
    let mut events: Vec<&operators::events::EventRow> =
        view.events.values().filter(|e| conversation.is_none_or(|c| e.conversation == c)).collect();
    events.sort_by(|a, b| {
        (&a.conversation, a.session, &a.time, &a.turns).cmp(&(&b.conversation, b.session, &b.time, &b.turns))
    });
    let events: Vec<serde_json::Value> = events
        .into_iter()
        .map(|e| {
            let mut v = serde_json::to_value(e).unwrap_or_default();
            v["group"] = json!(view.groups.get(&e.id).unwrap_or(&e.id));
            v["topic"] = json!(view.topic_of.get(&e.id));
            v
        })
        .collect();
    let relations: Vec<_> = match conversation {
        None => view.relations.iter().map(|r| r.as_ref()).collect(),
        Some(_) => view
            .relations
            .iter()
            .map(|r| r.as_ref())
            .filter(|r| view.events.contains_key(&r.from))
            .filter(|r| view.events.get(&r.from).is_some_and(|e| conversation == Some(e.conversation.as_str())))
            .collect(),
    };
    Ok(json!({"events": events, "relations": relations, "as_of": views.as_of}))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct Page {
    /// The first entry (in id order).
    offset: Option<usize>,
    /// How many entries (default 100, at most 1000).
    limit: Option<usize>,
    /// Wait until the views hold this receipt or Kafka position (for a layer ≥ 1, until its hierarchy does too).
    after: Option<String>,
}

#[utoipa::path(get, path = "/v1/spaces/{space}/layers/{layer}", tag = "memory",
    params(("space" = String, Path, description = "the space"), ("layer" = u32, Path, description = "0 for chunks and turns, 1 and up for clusters"), Page),
    responses((status = 200, description = "one page of a layer's nodes, in id order", body = crate::openapi::LayerPage),
              (status = 404, description = "no such space", body = ErrorBody),
              (status = 401, description = "no token, or an unknown one", body = ErrorBody),
              (status = 403, description = "the token does not reach the space", body = ErrorBody)))]
/// A layer's nodes, a page at a time: layer 0's chunks and turns, or a layer's clusters with their sizes and summaries
/// (what the memory browser's tree starts from).
async fn layer(
    State(s): State<Arc<Shared>>,
    Extension(grant): Extension<Grant>,
    Path((space, layer)): Path<(String, String)>,
    page: Result<Query<Page>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<crate::openapi::LayerPage>, AppError> {
    grant.require(Scope::Read, &space)?;
    let layer: u32 = layer.parse().map_err(|_| AppError::bad_request(format!("layer `{layer}` is not a number")))?;
    let Query(page) = page.map_err(|e| AppError::bad_request(format!("offset and limit are numbers: {e}")))?;
    if layer == 0 {
        wait_for(&s, page.after.as_deref()).await?;
    } else {
        wait_for_hierarchy(&s, page.after.as_deref()).await?;
    }
    let (offset, limit) = (page.offset.unwrap_or(0), page.limit.unwrap_or(100).clamp(1, 1000));
    let views = s.views();
    let view = space_view(&views, &space)?;
    let clip = |t: &str| t.split_whitespace().take(30).collect::<Vec<_>>().join(" ");
    let (total, nodes) = if layer == 0 {
        let mut ids: Vec<&operators::Name> = view.nodes.keys().collect();
        ids.sort();
        let nodes = ids
            .iter()
            .skip(offset)
            .take(limit)
            .map(|id| {
                let (n, _) = &view.nodes[*id];
                crate::openapi::LayerNode { id: n.id.to_string(), members: 0, text: Some(clip(&n.text)) }
            })
            .collect();
        (ids.len(), nodes)
    } else {
        let mut ids: Vec<(&String, &crate::views::ClusterView)> =
            view.clusters.iter().filter(|(_, c)| c.layer == layer).collect();
        ids.sort_by(|a, b| a.0.cmp(b.0));
        let nodes = ids
            .iter()
            .skip(offset)
            .take(limit)
            .map(|(id, c)| crate::openapi::LayerNode {
                id: id.to_string(),
                members: c.members.len(),
                text: c.summary.as_ref().map(|(t, _)| clip(t)),
            })
            .collect();
        (ids.len(), nodes)
    };
    let (as_of, hierarchy_as_of) = (views.as_of, views.hierarchy_as_of);
    Ok(Json(crate::openapi::LayerPage { layer, total, offset, nodes, as_of, hierarchy_as_of }))
}

/// The clusters waiting for a summary (debouncing, or in flight): the summariser's backlog.
#[utoipa::path(get, path = "/v1/spaces/{space}/summaries/pending", tag = "memory", params(("space" = String, Path, description = "the space: ASCII letters, digits, `-`, `_`, `.`")),
    responses((status = 200, description = "the requests waiting for the model", body = serde_json::Value),
              (status = 404, description = "no such space", body = ErrorBody), (status = 401, description = "no token, or an unknown one", body = ErrorBody), (status = 403, description = "the token does not reach the space", body = ErrorBody)))]
async fn pending_summaries(
    State(s): State<Arc<Shared>>,
    Extension(grant): Extension<Grant>,
    Path(space): Path<String>,
) -> Result<Json<serde_json::Value>, AppError> {
    grant.require(Scope::Read, &space)?;
    let views = s.views();
    let view = space_view(&views, &space)?;
    let pending: Vec<_> = view
        .requests
        .iter()
        .map(|(h, r)| {
            let mut v = json!({"content_hash": h, "kind": r.kind().name()});
            match r.as_ref() {
                ModelRequest::Summary { layer, cluster, members } => {
                    v["layer"] = json!(layer);
                    v["cluster"] = json!(cluster);
                    v["members"] = json!(members.len());
                }
                ModelRequest::Session { conversation, session, turns } => {
                    v["conversation"] = json!(conversation);
                    v["session"] = json!(session);
                    v["turns"] = json!(turns.len());
                }
                ModelRequest::Judge { pair } => v["events"] = json!([pair[0].0, pair[1].0]),
            }
            v
        })
        .collect();
    Ok(Json(json!({"pending": pending, "as_of": views.as_of})))
}

/// SIGINT and SIGTERM handlers, registered as soon as this is made (so that a signal during start-up is not lost to
/// the default action, which would skip the clean shutdown).
pub struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Must be called inside a tokio runtime.
    pub fn register() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// Resolves when SIGINT or SIGTERM arrives.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! { _ = self.term.recv() => {}, _ = self.int.recv() => {} }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
