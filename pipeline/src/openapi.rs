//! The OpenAPI 3.1 document of the HTTP API. The paths come from the handlers' `#[utoipa::path]` annotations, routed
//! by the same table that serves them ([`crate::http::routes`]); the bodies below are the types the handlers
//! serialise, so the document cannot drift from what is served. `docs/openapi.json` is the document as committed: a
//! test fails when a route or a body changes without it (`ENGRAM_UPDATE_OPENAPI=1 cargo test -p engram openapi`
//! rewrites it).

use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::ToSchema;

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "engram",
        description = "A streaming memory engine for LLM agents: ingest records into spaces, query them by mode \
                       (flat, hybrid, prune-and-grow, compass), read nodes, clusters, events and topics. Every route \
                       needs `Authorization: Bearer TOKEN` when tokens are configured (README, Access). MCP clients \
                       use `/mcp` (streamable HTTP) instead.",
        license(name = "Apache-2.0")
    ),
    components(schemas(
        crate::query::QueryRequest,
        crate::query::QueryResponse,
        crate::query::Evidence,
        crate::query::Mode,
        crate::http::ErrorBody,
        crate::http::ErrorDetail,
        IngestResponse,
        Rejected,
        Spaces,
        SpaceStats,
        Health,
        Errors,
        LayerPage,
        LayerNode
    )),
    tags(
        (name = "memory", description = "records in, queries and the memory's nodes out"),
        (name = "engine", description = "health and rejected inputs")
    )
)]
pub struct ApiDoc;

/// The document with its security scheme (bearer tokens) required on every operation, and its own route.
pub fn finish(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    let components = doc.components.get_or_insert_with(Default::default);
    components
        .add_security_scheme("bearer", SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()));
    doc.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new("bearer", Vec::<String>::new())]);
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc
}

/// What `POST /v1/spaces/{space}/records` answers.
#[derive(Serialize, ToSchema)]
pub struct IngestResponse {
    /// The epoch that holds the accepted records: pass it as `?after=` to read them. `null` when none was accepted.
    pub receipt: Option<String>,
    pub accepted: usize,
    /// The first `ingest.max-rejects-listed` rejects.
    pub rejected: Vec<Rejected>,
    /// Every reject, listed or not (all are dead-lettered).
    pub rejected_total: usize,
}

#[derive(Serialize, ToSchema)]
pub struct Rejected {
    /// The record's index in the request.
    pub index: usize,
    pub reason: String,
}

/// What `GET /v1/spaces` answers.
#[derive(Serialize, ToSchema)]
pub struct Spaces {
    pub spaces: Vec<SpaceStats>,
    /// The last epoch whose layer 0 and events the views reflect.
    pub as_of: Option<u64>,
    /// The last epoch whose hierarchy and summaries the views reflect (they follow layer 0: at most `as_of`).
    pub hierarchy_as_of: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub struct SpaceStats {
    pub space: String,
    pub nodes: usize,
    pub edges: usize,
    /// Nodes per layer, layer 0 first.
    pub layers: Vec<usize>,
    pub clusters: usize,
    pub summaries_pending: usize,
    pub events: usize,
    pub relations: usize,
    pub merged_events: usize,
    pub topics: usize,
    pub as_of: Option<u64>,
    pub hierarchy_as_of: Option<u64>,
}

/// What `GET /v1/spaces/{space}/layers/{layer}` answers.
#[derive(Serialize, ToSchema)]
pub struct LayerPage {
    pub layer: u32,
    /// Nodes in the layer.
    pub total: usize,
    pub offset: usize,
    pub nodes: Vec<LayerNode>,
    pub as_of: Option<u64>,
    pub hierarchy_as_of: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub struct LayerNode {
    pub id: String,
    /// A cluster's members (0 at layer 0).
    pub members: usize,
    /// The first words of the text or summary (`null`: a cluster waiting for its summary).
    pub text: Option<String>,
}

/// What `/healthz` answers.
#[derive(Serialize, ToSchema)]
pub struct Health {
    /// ok | failed
    pub status: String,
    /// Why the engine failed.
    pub reason: Option<String>,
    /// The last epoch whose layer 0 and events the views reflect.
    pub as_of: Option<u64>,
    /// The last epoch whose hierarchy and summaries the views reflect (at most `as_of`).
    pub hierarchy_as_of: Option<u64>,
}

/// What `GET /v1/errors` answers.
#[derive(Serialize, ToSchema)]
pub struct Errors {
    /// Every reject of this process (for a token over every space; else null).
    pub total: Option<u64>,
    /// The latest rejects the token may see: `{"source","reason","raw","space"}`.
    #[schema(value_type = Vec<Object>)]
    pub recent: Vec<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    /// The served document equals `docs/openapi.json`: a route or body changed without the committed document fails
    /// here (rewrite it with `ENGRAM_UPDATE_OPENAPI=1`).
    #[test]
    fn the_document_is_committed_and_covers_every_route() {
        let doc = serde_json::to_value(crate::http::openapi()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths: Vec<&str> = doc["paths"].as_object().unwrap().keys().map(String::as_str).collect();
        for p in [
            "/healthz",
            "/v1/spaces",
            "/v1/errors",
            "/v1/spaces/{space}/records",
            "/v1/spaces/{space}/query",
            "/v1/spaces/{space}/nodes/{id}",
            "/v1/spaces/{space}/summaries/pending",
            "/v1/spaces/{space}/events",
            "/v1/spaces/{space}/layers/{layer}",
        ] {
            assert!(paths.contains(&p), "{p} is documented: {paths:?}");
        }
        let query = &doc["components"]["schemas"]["QueryRequest"]["properties"];
        for field in ["query", "mode", "budget_words", "k", "answer", "use_model"] {
            assert!(query.get(field).is_some(), "QueryRequest.{field}: {query}");
        }
        let text = serde_json::to_string_pretty(&doc).unwrap() + "\n";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
        if std::env::var_os("ENGRAM_UPDATE_OPENAPI").is_some() {
            std::fs::write(&path, &text).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == text,
            "docs/openapi.json is not the API's document: rewrite it with ENGRAM_UPDATE_OPENAPI=1 cargo test -p engram openapi"
        );
    }
}
