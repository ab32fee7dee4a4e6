//! The MCP server against the real binary, with the official SDK's client (rmcp) over streamable HTTP: list the
//! tools, add records, search after the receipt, read a node and a conversation's events, delete, and bad calls get
//! MCP errors carrying the HTTP error's code; the token's scope holds; `engram mcp` relays stdio to it.

use std::io::{BufRead, BufReader, Write};

use rmcp::model::{CallToolRequestParams, ClientConfig};
use rmcp::service::ServiceError;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};

use crate::common::{engram, tokens_file, Engine};

const WRITER: &str = "mcp-writer-token-0123456789";
const READER: &str = "mcp-reader-token-0123456789";

type Client = rmcp::service::RunningService<rmcp::RoleClient, ClientConfig>;

async fn connect(api: &str, token: Option<&str>) -> Result<Client, String> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(format!("{api}/mcp"));
    if let Some(t) = token {
        config = config.auth_header(t);
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    ClientConfig::default().serve(transport).await.map_err(|e| e.to_string())
}

/// Calls a tool; its JSON result, or the MCP error's (message, data).
async fn call(client: &Client, tool: &str, args: Value) -> Result<Value, (String, Value)> {
    let args = args.as_object().cloned().unwrap_or_default();
    match client.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args)).await {
        Ok(r) => {
            let text = r.content[0].as_text().expect("a text result").text.clone();
            if r.is_error == Some(true) {
                // The SDK's own refusals (arguments that do not match the schema) are error results.
                return Err((text, Value::Null));
            }
            Ok(serde_json::from_str(&text).expect("JSON text"))
        }
        Err(ServiceError::McpError(e)) => Err((e.message.to_string(), e.data.unwrap_or(Value::Null))),
        Err(e) => panic!("{tool}: {e}"),
    }
}

#[tokio::test]
async fn an_mcp_client_adds_searches_reads_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let file = tokens_file(
        dir.path(),
        &[("writer", WRITER, "write", &["notes"], 0), ("reader", READER, "read", &["notes"], 0)],
    );
    let file = file.display().to_string();
    let engine = Engine::start(&dir.path().join("data"), &[], &[("ENGRAM__AUTH__TOKENS_FILE", file.as_str())]);

    // No token, or a wrong one: the connection is refused before MCP.
    assert!(connect(&engine.api, None).await.is_err());
    assert!(connect(&engine.api, Some("nope")).await.is_err());

    let client = connect(&engine.api, Some(WRITER)).await.unwrap();
    let info = client.peer_info().expect("server info");
    assert_eq!(info.server_info.as_ref().map(|i| i.name.as_str()), Some("engram"));
    let mut tools: Vec<String> = client.list_all_tools().await.unwrap().iter().map(|t| t.name.to_string()).collect();
    tools.sort();
    assert_eq!(tools, ["add_records", "delete", "get_events", "get_node", "list_spaces", "search"]);
    let search_schema = client.list_all_tools().await.unwrap().into_iter().find(|t| t.name == "search").unwrap();
    let required = search_schema.input_schema.get("required").cloned().unwrap_or_default();
    assert_eq!(required, json!(["space", "query"]), "input schemas come from the types");

    let records = json!([
        {"kind": "chunk", "doc": "storm", "seq": 0, "text": "A storm flooded the harbour district overnight."},
        {"kind": "chunk", "doc": "cup", "seq": 0, "text": "The football club won the cup semi-final."},
        {"kind": "turn", "conversation": "standup", "turn": "t1", "speaker": "Ana", "text": "I fixed the harbour pump today."},
        {"kind": "turn", "conversation": "standup", "turn": "t2", "speaker": "Ben", "text": "Great, the pump was failing since Monday."},
        {"kind": "nope"}
    ]);
    let receipt = call(&client, "add_records", json!({"space": "notes", "records": records})).await.unwrap();
    assert_eq!((receipt["accepted"].as_u64(), receipt["rejected_total"].as_u64()), (Some(4), Some(1)), "{receipt}");
    let after = receipt["receipt"].as_str().unwrap().to_string();

    let found = call(
        &client,
        "search",
        json!({"space": "notes", "query": "who won the cup?", "mode": "flat", "k": 1, "after": after}),
    )
    .await
    .unwrap();
    assert_eq!(found["evidence"][0]["id"], "cup#0", "{found}");
    let node = call(&client, "get_node", json!({"space": "notes", "id": "storm#0"})).await.unwrap();
    assert_eq!(node["text"], "A storm flooded the harbour district overnight.");
    let spaces = call(&client, "list_spaces", json!({})).await.unwrap();
    assert_eq!(spaces["spaces"][0]["space"], "notes");
    assert_eq!(spaces["spaces"][0]["nodes"], 4);
    let events = call(&client, "get_events", json!({"space": "notes", "conversation": "standup"})).await.unwrap();
    let events = events["events"].as_array().unwrap();
    assert!(!events.is_empty() && events.iter().all(|e| e["conversation"] == "standup"), "{events:?}");

    let deleted = call(&client, "delete", json!({"space": "notes", "doc": "cup"})).await.unwrap();
    let after = deleted["receipt"].as_str().unwrap().to_string();
    let gone = call(&client, "get_node", json!({"space": "notes", "id": "cup#0", "after": after})).await.unwrap_err();
    assert_eq!(gone.1["code"], "unknown_node", "{gone:?}");
    assert_eq!(gone.1["status"], 404);

    // Bad calls: MCP errors with the HTTP error's code.
    let (msg, data) = call(&client, "search", json!({"space": "hr", "query": "salaries"})).await.unwrap_err();
    assert_eq!((data["code"].as_str(), data["status"].as_u64()), (Some("forbidden"), Some(403)), "{msg}");
    let (_, data) = call(&client, "search", json!({"space": "notes", "query": "x", "k": 100000})).await.unwrap_err();
    assert_eq!(data["code"], "bad_request");
    let (_, data) = call(&client, "delete", json!({"space": "notes"})).await.unwrap_err();
    assert_eq!(data["code"], "bad_request");
    let (msg, _) = call(&client, "search", json!({"space": "notes"})).await.unwrap_err();
    assert!(msg.contains("query"), "a missing argument: {msg}");
    assert!(call(&client, "no_such_tool", json!({})).await.is_err());
    let (_, data) =
        call(&client, "search", json!({"space": "notes", "query": "x", "after": "999999"})).await.unwrap_err();
    assert_eq!(data["code"], "unknown_receipt");
    client.cancel().await.unwrap();

    // A read token may search but not write.
    let reader = connect(&engine.api, Some(READER)).await.unwrap();
    assert!(call(&reader, "search", json!({"space": "notes", "query": "storm"})).await.is_ok());
    let (_, data) =
        call(&reader, "add_records", json!({"space": "notes", "records": [{"kind": "delete", "doc": "storm"}]}))
            .await
            .unwrap_err();
    assert_eq!(data["code"], "forbidden");
    reader.cancel().await.unwrap();

    // `engram mcp` relays a desktop client's stdio to the engine.
    let mut relay = engram()
        .args(["mcp", "--url", &engine.api])
        .env("ENGRAM_TOKEN", READER)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = relay.stdin.take().unwrap();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "desktop", "version": "1"}}});
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    let call_search = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "search", "arguments": {"space": "notes", "query": "harbour storm", "mode": "flat", "k": 1}}});
    for m in [&init, &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}), &list, &call_search] {
        writeln!(stdin, "{m}").unwrap();
    }
    drop(stdin);
    let out = BufReader::new(relay.stdout.take().unwrap());
    let replies: Vec<Value> = out.lines().map(|l| serde_json::from_str(&l.unwrap()).unwrap()).collect();
    let _ = relay.wait();
    assert_eq!(replies.len(), 3, "one reply per request, none for the notification: {replies:?}");
    assert_eq!(replies[0]["result"]["serverInfo"]["name"], "engram");
    assert_eq!(replies[1]["result"]["tools"].as_array().unwrap().len(), 6);
    let text = replies[2]["result"]["content"][0]["text"].as_str().unwrap();
    let found: Value = serde_json::from_str(text).unwrap();
    assert_eq!(found["evidence"][0]["id"], "storm#0", "{found}");
}
