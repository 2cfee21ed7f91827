//! The API against the real router (`tower::ServiceExt::oneshot`), on a
//! temporary SQLite store, with a worker where a test needs events to run.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::Router;
use herald::{Client, Context, HandlerError, MemoryQueue, Worker, WorkerBuilder};
use herald_sqlite::SqliteStore;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tower::ServiceExt;

use super::api::{self, AppState};
use super::auth::Tokens;
use super::recent::Tracker;
use super::telemetry;
use crate::config::AuthConfig;

const OPERATOR: &str = "operator-secret";
const ACME: &str = "acme-secret";
const BETA: &str = "beta-secret";

fn sha(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn tokens() -> AuthConfig {
    AuthConfig {
        operator: Some(sha(OPERATOR)),
        tenants: vec![("acme".into(), sha(ACME)), ("beta".into(), sha(BETA))],
    }
}

struct Harness {
    app: Router,
    worker: Option<Worker>,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// A router with no worker: events stay pending.
    async fn new(auth: AuthConfig) -> Self {
        Self::build(auth, 1 << 20, None).await
    }

    /// A router and a worker with the given handlers.
    async fn with_worker(
        auth: AuthConfig,
        handlers: impl FnOnce(WorkerBuilder) -> WorkerBuilder + 'static,
    ) -> Self {
        Self::build(auth, 1 << 20, Some(Box::new(handlers))).await
    }

    #[allow(clippy::type_complexity)]
    async fn build(
        auth: AuthConfig,
        max_payload: usize,
        handlers: Option<Box<dyn FnOnce(WorkerBuilder) -> WorkerBuilder>>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SqliteStore::open(dir.path().join("api.db")).unwrap());
        let queue = Arc::new(MemoryQueue::default());
        let tracker = Arc::new(Tracker::default());
        let metrics = telemetry::install().unwrap();
        let worker = handlers.map(|add| {
            add(Worker::builder(store.clone(), queue.clone()))
                .observer(tracker.clone())
                .lease(Duration::from_secs(3))
                .start()
        });
        let state = Arc::new(AppState {
            schedules: store.clone(),
            client: Client::new(store, queue).max_payload(max_payload),
            tokens: Tokens::new(&auth),
            tracker,
            metrics,
            max_batch: 100,
            max_request_bytes: max_payload + 64 * 1024,
            handlers: vec![],
        });
        Harness {
            app: api::router(state),
            worker,
            _dir: dir,
        }
    }

    async fn raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> (StatusCode, HeaderMap, Value, String) {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        if let Some(ct) = content_type {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        let response = self
            .app
            .clone()
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, headers, value, text)
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let (ct, bytes) = match body {
            Some(b) => (Some("application/json"), serde_json::to_vec(&b).unwrap()),
            None => (None, Vec::new()),
        };
        let (status, _, value, _) = self.raw(method, path, token, ct, bytes).await;
        (status, value)
    }

    async fn emit(&self, token: &str, body: Value) -> String {
        let (status, v) = self
            .call(Method::POST, "/v1/events", Some(token), Some(body))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        v["id"].as_str().unwrap().to_string()
    }

    async fn stop(self) {
        if let Some(w) = self.worker {
            w.shutdown(Duration::ZERO).await;
        }
    }
}

/// Asserts an error response: status, code, and words in the message.
fn assert_error(status: StatusCode, v: &Value, want: StatusCode, code: &str, words: &[&str]) {
    assert_eq!(status, want, "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    let message = v["error"]["message"].as_str().expect("a message");
    for w in words {
        assert!(message.contains(w), "{w:?} not in {message:?}");
    }
    assert_eq!(
        v.as_object().unwrap().len(),
        1,
        "only `error` at the top: {v}"
    );
}

/// Percent-encodes everything but unreserved characters.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn emit_then_show_returns_the_payload_exactly() {
    let h = Harness::new(tokens()).await;
    let payload = r#"{"b": [1, 2.50, "x"],   "a":{"nested" :true}}"#;
    let body = format!(
        r#"{{"tenant":"acme","handler":"send_email","payload":{payload},"max_attempts":3}}"#
    );
    let (status, _, v, _) = h
        .raw(
            Method::POST,
            "/v1/events",
            Some(ACME),
            Some("application/json"),
            body.into_bytes(),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["created"], true);
    let id = v["id"].as_str().unwrap();
    let (status, _, v, text) = h
        .raw(
            Method::GET,
            &format!("/v1/events/{id}"),
            Some(ACME),
            None,
            vec![],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(text.contains(payload), "payload not shown exactly: {text}");
    assert_eq!(v["tenant"], "acme");
    assert_eq!(v["state"], "pending");
    assert_eq!(v["running"], false);
    assert_eq!(v["attempt"], 0);
    assert_eq!(v["max_attempts"], 3);
    assert_eq!(v["last_error"], Value::Null);
    assert!(v["run_at"].as_str().unwrap().ends_with('Z'));
}

#[tokio::test]
async fn an_idempotency_hit_answers_200_with_the_first_id() {
    let h = Harness::new(tokens()).await;
    let body =
        json!({"tenant": "acme", "handler": "h", "payload": 1, "idempotency_key": "order-7"});
    let first = h.emit(ACME, body.clone()).await;
    let (status, v) = h
        .call(Method::POST, "/v1/events", Some(ACME), Some(body))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v, json!({"id": first, "created": false}));
}

#[tokio::test]
async fn a_delay_is_parsed_and_a_bad_one_is_explained() {
    let h = Harness::new(tokens()).await;
    let id = h
        .emit(
            ACME,
            json!({"tenant": "acme", "handler": "h", "payload": {}, "delay": "1h"}),
        )
        .await;
    let (_, v) = h
        .call(Method::GET, &format!("/v1/events/{id}"), Some(ACME), None)
        .await;
    let run_at = humantime::parse_rfc3339(v["run_at"].as_str().unwrap()).unwrap();
    let ahead = run_at.duration_since(std::time::SystemTime::now()).unwrap();
    assert!(ahead > Duration::from_secs(3590), "{ahead:?}");
    let (status, v) = h
        .call(
            Method::POST,
            "/v1/events",
            Some(ACME),
            Some(json!({"tenant": "acme", "handler": "h", "payload": {}, "delay": "soon"})),
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_delay",
        &["delay:", "\"soon\"", "\"30s\""],
    );
}

#[tokio::test]
async fn a_run_at_is_stored_exactly_and_a_bad_or_doubled_one_is_explained() {
    let h = Harness::new(tokens()).await;
    let event =
        |run_at: &str| json!({"tenant": "acme", "handler": "h", "payload": {}, "run_at": run_at});
    // An offset other than Z names the same instant.
    let id = h.emit(ACME, event("2099-01-02T04:05:06.789+01:00")).await;
    let (_, v) = h
        .call(Method::GET, &format!("/v1/events/{id}"), Some(ACME), None)
        .await;
    assert_eq!(v["run_at"], "2099-01-02T03:05:06.789Z", "{v}");
    // On a topic too.
    let (status, v) = h
        .call(
            Method::PUT,
            "/v1/tenants/acme/topics/orders/subscribers/h",
            Some(ACME),
            None,
        )
        .await;
    assert!(status.is_success(), "{status} {v}");
    let (status, v) = h
        .call(
            Method::POST,
            "/v1/tenants/acme/topics/orders/events",
            Some(ACME),
            Some(json!({"payload": {}, "run_at": "2099-01-02T03:05:06Z"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let copy = v["events"][0]["id"].as_str().unwrap().to_string();
    let (_, v) = h
        .call(Method::GET, &format!("/v1/events/{copy}"), Some(ACME), None)
        .await;
    assert_eq!(v["run_at"], "2099-01-02T03:05:06.000Z", "{v}");
    for (body, code, says) in [
        (
            event("tomorrow"),
            "invalid_run_at",
            vec!["run_at", "\"tomorrow\"", "RFC 3339"],
        ),
        (
            json!({"tenant": "acme", "handler": "h", "payload": {}, "run_at": "2099-01-02T03:05:06Z", "delay": "1h"}),
            "invalid_run_at",
            vec!["not both"],
        ),
    ] {
        let (status, v) = h
            .call(Method::POST, "/v1/events", Some(ACME), Some(body))
            .await;
        assert_error(status, &v, StatusCode::UNPROCESSABLE_ENTITY, code, &says);
    }
}

#[tokio::test]
async fn a_batch_answers_in_order_and_one_bad_event_refuses_it_by_index() {
    let h = Harness::new(tokens()).await;
    let ev = |n: u32| json!({"tenant": "acme", "handler": "h", "payload": n});
    let (status, v) = h
        .call(
            Method::POST,
            "/v1/events/batch",
            Some(ACME),
            Some(json!({"events": [ev(1), ev(2), ev(3)]})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for (i, r) in results.iter().enumerate() {
        let (_, e) = h
            .call(
                Method::GET,
                &format!("/v1/events/{}", r["id"].as_str().unwrap()),
                Some(ACME),
                None,
            )
            .await;
        assert_eq!(e["payload"], json!(i + 1));
    }
    // A bad name at index 2: nothing of the batch is stored.
    let bad = json!({"events": [ev(4), ev(5), {"tenant": "acme", "handler": "", "payload": 6}]});
    let (status, v) = h
        .call(Method::POST, "/v1/events/batch", Some(ACME), Some(bad))
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_name",
        &["events[2]", "handler", "empty"],
    );
    // A wrong type at index 1 names its path.
    let bad = json!({"events": [ev(4), {"tenant": "acme", "handler": "h", "payload": 1, "max_attempts": "x"}]});
    let (status, v) = h
        .call(Method::POST, "/v1/events/batch", Some(ACME), Some(bad))
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_field",
        &["events[1].max_attempts", "invalid type"],
    );
    // Another tenant at index 1.
    let bad = json!({"events": [ev(4), {"tenant": "beta", "handler": "h", "payload": 1}]});
    let (status, v) = h
        .call(Method::POST, "/v1/events/batch", Some(ACME), Some(bad))
        .await;
    assert_error(
        status,
        &v,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["events[1]", "\"beta\""],
    );
    // A batch of one still names the index.
    let bad =
        json!({"events": [{"tenant": "acme", "handler": "h", "payload": 1, "max_attempts": 0}]});
    let (status, v) = h
        .call(Method::POST, "/v1/events/batch", Some(ACME), Some(bad))
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_max_attempts",
        &["events[0]"],
    );
    let (status, v) = h
        .call(
            Method::POST,
            "/v1/events/batch",
            Some(ACME),
            Some(json!({"events": []})),
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "empty_batch",
        &["1 to 100"],
    );
    let many: Vec<Value> = (0..101).map(ev).collect();
    let (status, v) = h
        .call(
            Method::POST,
            "/v1/events/batch",
            Some(ACME),
            Some(json!({"events": many})),
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "batch_too_large",
        &["101", "limit of 100"],
    );
    let (_, v) = h.call(Method::GET, "/v1/events", Some(ACME), None).await;
    assert_eq!(
        v["events"].as_array().unwrap().len(),
        3,
        "refused batches stored nothing"
    );
}

#[tokio::test]
async fn malformed_json_is_a_400_that_says_so() {
    let h = Harness::new(tokens()).await;
    for body in [
        &b"{\"tenant\": \"acme\","[..],
        b"not json",
        br#"{"tenant":"acme","handler":"h","payload":1} trailing"#,
        b"",
    ] {
        let (status, _, v, _) = h
            .raw(
                Method::POST,
                "/v1/events",
                Some(ACME),
                Some("application/json"),
                body.to_vec(),
            )
            .await;
        assert_error(
            status,
            &v,
            StatusCode::BAD_REQUEST,
            "malformed_json",
            &["not valid JSON"],
        );
    }
}

#[tokio::test]
async fn wrong_types_missing_and_unknown_fields_are_named() {
    let h = Harness::new(tokens()).await;
    let cases = [
        (
            json!({"tenant": 7, "handler": "h", "payload": 1}),
            "tenant",
            "invalid type: integer `7`, expected a string",
        ),
        (
            json!({"tenant": "acme", "handler": "h", "payload": 1, "max_attempts": -1}),
            "max_attempts",
            "invalid value",
        ),
        (
            json!({"tenant": "acme", "handler": "h"}),
            "missing field `payload`",
            "",
        ),
        (
            json!({"tenant": "acme", "handler": "h", "payload": 1, "priority": 5}),
            "unknown field `priority`",
            "expected one of",
        ),
        (
            json!(["acme", "h", 1, null, null, null]),
            "JSON array",
            "send a JSON object",
        ),
    ];
    for (body, a, b) in cases {
        let (status, v) = h
            .call(Method::POST, "/v1/events", Some(ACME), Some(body.clone()))
            .await;
        assert_error(
            status,
            &v,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &[a, b],
        );
    }
    let (status, v) = h
        .call(
            Method::POST,
            "/v1/events/batch",
            Some(ACME),
            Some(json!({"events": [], "atomic": true})),
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_field",
        &["unknown field `atomic`"],
    );
}

#[tokio::test]
async fn a_body_that_is_not_declared_json_is_a_415() {
    let h = Harness::new(tokens()).await;
    let body = br#"{"tenant":"acme","handler":"h","payload":1}"#.to_vec();
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let (status, _, v, _) = h
            .raw(Method::POST, "/v1/events", Some(ACME), ct, body.clone())
            .await;
        assert_error(
            status,
            &v,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            &["Content-Type: application/json"],
        );
    }
    let (status, _, v, _) = h
        .raw(
            Method::POST,
            "/v1/events",
            Some(ACME),
            Some("application/json; charset=utf-8"),
            body,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
}

#[tokio::test]
async fn a_payload_over_the_limit_is_a_413() {
    let h = Harness::build(tokens(), 1000, None).await;
    let exact = format!("\"{}\"", "x".repeat(998));
    let body = |p: &str| format!(r#"{{"tenant":"acme","handler":"h","payload":{p}}}"#).into_bytes();
    let (status, _, v, _) = h
        .raw(
            Method::POST,
            "/v1/events",
            Some(ACME),
            Some("application/json"),
            body(&exact),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a payload of exactly the limit is accepted: {v}"
    );
    let over = format!("\"{}\"", "x".repeat(999));
    let (status, _, v, _) = h
        .raw(
            Method::POST,
            "/v1/events",
            Some(ACME),
            Some("application/json"),
            body(&over),
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        &["1001 bytes", "limit of 1000"],
    );
    // A body over max_request_bytes is refused before it is parsed.
    let huge = format!("\"{}\"", "x".repeat(100_000));
    let (status, _, v, _) = h
        .raw(
            Method::POST,
            "/v1/events",
            Some(ACME),
            Some("application/json"),
            body(&huge),
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
        &["max_request_bytes"],
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_json() {
    let h = Harness::new(tokens()).await;
    let (status, v) = h
        .call(Method::GET, "/v1/nothing", Some(OPERATOR), None)
        .await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "not_found",
        &["GET /v1/nothing", "/openapi.json"],
    );
    let (status, v) = h.call(Method::GET, "/nothing", None, None).await;
    assert_error(status, &v, StatusCode::NOT_FOUND, "not_found", &[]);
    let (status, v) = h.call(Method::GET, "/ui/missing.js", None, None).await;
    assert_error(status, &v, StatusCode::NOT_FOUND, "not_found", &[]);
    let (status, v) = h
        .call(Method::PATCH, "/v1/events", Some(OPERATOR), None)
        .await;
    assert_error(
        status,
        &v,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        &["PATCH"],
    );
}

#[tokio::test]
async fn a_missing_or_wrong_token_is_a_401_with_a_challenge() {
    let h = Harness::new(tokens()).await;
    let (status, headers, v, _) = h.raw(Method::GET, "/v1/events", None, None, vec![]).await;
    assert_error(
        status,
        &v,
        StatusCode::UNAUTHORIZED,
        "missing_token",
        &["Authorization: Bearer"],
    );
    assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
    let (status, headers, v, _) = h
        .raw(Method::GET, "/v1/events", Some("guess"), None, vec![])
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNAUTHORIZED,
        "invalid_token",
        &["matches no configured token"],
    );
    assert!(headers[header::WWW_AUTHENTICATE]
        .to_str()
        .unwrap()
        .starts_with("Bearer"));
    // Not a bearer scheme.
    let req = Request::get("/v1/stats")
        .header(header::AUTHORIZATION, format!("Basic {OPERATOR}"))
        .body(Body::empty())
        .unwrap();
    let r = h.app.clone().oneshot(req).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // The token is checked before the body: no hint from parsing.
    let (status, _) = h
        .call(Method::POST, "/v1/events", None, Some(json!({"junk": 1})))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Open routes.
    let (status, _, _, text) = h.raw(Method::GET, "/metrics", None, None, vec![]).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, v) = h.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["openapi"], "3.1.0");
}

#[tokio::test]
async fn a_tenant_token_is_confined_to_its_tenant() {
    let h = Harness::new(tokens()).await;
    let beta_event = h
        .emit(
            BETA,
            json!({"tenant": "beta", "handler": "h", "payload": 1}),
        )
        .await;
    let acme_event = h
        .emit(
            ACME,
            json!({"tenant": "acme", "handler": "h", "payload": 1}),
        )
        .await;
    let forbidden: Vec<(Method, String, Option<Value>)> = vec![
        (
            Method::POST,
            "/v1/events".into(),
            Some(json!({"tenant": "beta", "handler": "h", "payload": 1})),
        ),
        (Method::GET, "/v1/events?tenant=beta".into(), None),
        (Method::GET, format!("/v1/events/{beta_event}"), None),
        (Method::POST, format!("/v1/events/{beta_event}/retry"), None),
        (Method::DELETE, format!("/v1/events/{beta_event}"), None),
        (
            Method::PUT,
            "/v1/tenants/beta/handlers/h/pause".into(),
            None,
        ),
        (
            Method::DELETE,
            "/v1/tenants/beta/handlers/h/pause".into(),
            None,
        ),
        (
            Method::PUT,
            "/v1/tenants/acme/handlers/h/block".into(),
            None,
        ),
        (
            Method::DELETE,
            "/v1/tenants/acme/handlers/h/block".into(),
            None,
        ),
    ];
    for (method, path, body) in forbidden {
        let (status, v) = h.call(method.clone(), &path, Some(ACME), body).await;
        assert_error(status, &v, StatusCode::FORBIDDEN, "forbidden", &[]);
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains("operator token"), "{method} {path}: {m}");
    }
    // Its own tenant: allowed; listing without a tenant lists its own.
    let (status, v) = h.call(Method::GET, "/v1/events", Some(ACME), None).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![acme_event.as_str()]);
    let (status, v) = h
        .call(
            Method::PUT,
            "/v1/tenants/acme/handlers/h/pause",
            Some(ACME),
            None,
        )
        .await;
    assert_eq!((status, v), (StatusCode::OK, json!({"added": true})));
    // The operator may do everything, including block.
    let (status, v) = h
        .call(
            Method::PUT,
            "/v1/tenants/beta/handlers/h/block",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!((status, v), (StatusCode::OK, json!({"added": true})));
    let (_, v) = h.call(Method::GET, "/v1/rules", Some(ACME), None).await;
    assert_eq!(
        v,
        json!({"rules": [{"tenant": "acme", "handler": "h", "kind": "pause"}]})
    );
    let (_, v) = h.call(Method::GET, "/v1/rules", Some(OPERATOR), None).await;
    assert_eq!(v["rules"].as_array().unwrap().len(), 2);
    let (_, v) = h.call(Method::GET, "/v1/stats", Some(ACME), None).await;
    assert_eq!(v["by_handler"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["by_handler"][0]["tenant"], "acme");
    assert_eq!(v["by_handler"][0]["paused"], true);
    assert_eq!(v["recent"], Value::Null);
}

#[tokio::test]
async fn without_configured_tokens_every_caller_is_the_operator() {
    let h = Harness::new(AuthConfig::default()).await;
    let (status, v) = h
        .call(Method::PUT, "/v1/tenants/t/handlers/h/block", None, None)
        .await;
    assert_eq!((status, v), (StatusCode::OK, json!({"added": true})));
    let (status, _) = h
        .call(Method::GET, "/v1/events", Some("anything"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn odd_names_round_trip_exactly_and_control_characters_are_refused() {
    let h = Harness::new(tokens()).await;
    let names = [
        "O'Brien \"quoted\"",
        "a/b/../c",
        "ünïcødé 🚀 名前",
        "'; DROP TABLE events; --",
        "100% + more?&x=y#frag",
    ];
    for tenant in names {
        for handler in names {
            let id = h
                .emit(OPERATOR, json!({"tenant": tenant, "handler": handler, "payload": {"t": tenant}, "idempotency_key": handler}))
                .await;
            let (_, v) = h
                .call(
                    Method::GET,
                    &format!("/v1/events/{id}"),
                    Some(OPERATOR),
                    None,
                )
                .await;
            assert_eq!(v["tenant"], tenant);
            assert_eq!(v["handler"], handler);
            assert_eq!(v["idempotency_key"], handler);
            assert_eq!(v["payload"], json!({"t": tenant}));
        }
        // In a query string and in a path, percent-encoded.
        let (status, v) = h
            .call(
                Method::GET,
                &format!("/v1/events?tenant={}&limit=1000", enc(tenant)),
                Some(OPERATOR),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(
            v["events"].as_array().unwrap().len(),
            names.len(),
            "{tenant}"
        );
        let path = format!(
            "/v1/tenants/{}/handlers/{}/pause",
            enc(tenant),
            enc(names[1])
        );
        let (status, v) = h.call(Method::PUT, &path, Some(OPERATOR), None).await;
        assert_eq!(
            (status, v),
            (StatusCode::OK, json!({"added": true})),
            "{path}"
        );
    }
    let (_, v) = h.call(Method::GET, "/v1/rules", Some(OPERATOR), None).await;
    let mut shown: Vec<&str> = v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tenant"].as_str().unwrap())
        .collect();
    shown.sort();
    let mut want = names.to_vec();
    want.sort();
    assert_eq!(shown, want);
    assert!(v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["handler"] == names[1]));
    let (_, v) = h.call(Method::GET, "/v1/stats", Some(OPERATOR), None).await;
    assert_eq!(
        v["by_handler"].as_array().unwrap().len(),
        names.len() * names.len()
    );

    // Control characters: refused by the naming rule, in a body and in a path.
    let (status, v) = h
        .call(
            Method::POST,
            "/v1/events",
            Some(OPERATOR),
            Some(json!({"tenant": "a\nb", "handler": "h", "payload": 1})),
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_name",
        &["tenant", "control character", "without control characters"],
    );
    let (status, v) = h
        .call(
            Method::PUT,
            "/v1/tenants/a%0Ab/handlers/h/pause",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_name",
        &["control character"],
    );
    let (status, v) = h
        .call(
            Method::POST,
            "/v1/events",
            Some(OPERATOR),
            Some(json!({"tenant": "t", "handler": "x".repeat(201), "payload": 1})),
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_name",
        &["longer than 200 bytes"],
    );
}

#[tokio::test]
async fn listing_pages_with_a_keyset_cursor_and_refuses_bad_parameters() {
    let h = Harness::new(tokens()).await;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(
            h.emit(
                ACME,
                json!({"tenant": "acme", "handler": "h", "payload": n}),
            )
            .await,
        );
    }
    let mut seen = Vec::new();
    let mut path = "/v1/events?limit=2".to_string();
    loop {
        let (status, v) = h.call(Method::GET, &path, Some(ACME), None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        seen.extend(
            v["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].as_str().unwrap().to_string()),
        );
        match v["next"].as_str() {
            Some(next) => path = format!("/v1/events?limit=2&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, ids);
    let (_, v) = h
        .call(
            Method::GET,
            "/v1/events?state=dead&handler=h",
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(v, json!({"events": [], "next": null}));
    let bad = [
        (
            "/v1/events?state=running",
            "state: \"running\" is not a state",
        ),
        (
            "/v1/events?limit=0",
            "limit: \"0\" is not a whole number from 1 to 1000",
        ),
        ("/v1/events?limit=lots", "limit"),
        ("/v1/events?after=xyz", "after: \"xyz\" is not a cursor"),
        ("/v1/events?sort=desc", "unknown field `sort`"),
    ];
    for (path, words) in bad {
        let (status, v) = h.call(Method::GET, path, Some(ACME), None).await;
        assert_error(
            status,
            &v,
            StatusCode::BAD_REQUEST,
            "invalid_query",
            &[words],
        );
    }
}

/// Every `%` that does not start an escape is refused, in a path as
/// `invalid_path` (as a bad UTF-8 escape already was) and in a query string
/// as `invalid_query`; nothing is stored. `%25ZZ` is the tenant `%ZZ`.
#[tokio::test]
async fn malformed_percent_escapes_are_refused_in_paths_and_queries() {
    let h = Harness::new(tokens()).await;
    let bad_names = ["%ZZ", "%", "%Z", "%G0", "%0G", "a%2", "%%41", "x%zz"];
    for name in bad_names {
        for path in [
            format!("/v1/tenants/{name}/handlers/ok/pause"),
            format!("/v1/tenants/acme/handlers/{name}/pause"),
        ] {
            let (status, v) = h.call(Method::PUT, &path, Some(OPERATOR), None).await;
            assert_error(
                status,
                &v,
                StatusCode::BAD_REQUEST,
                "invalid_path",
                &["is not a percent-escape"],
            );
        }
        let (status, v) = h
            .call(
                Method::GET,
                &format!("/v1/events/{name}"),
                Some(OPERATOR),
                None,
            )
            .await;
        assert_error(status, &v, StatusCode::BAD_REQUEST, "invalid_path", &[]);
        for query in [
            format!("tenant={name}"),
            format!("{name}=1"),
            format!("limit=5&handler={name}"),
        ] {
            let (status, v) = h
                .call(
                    Method::GET,
                    &format!("/v1/events?{query}"),
                    Some(OPERATOR),
                    None,
                )
                .await;
            assert_error(
                status,
                &v,
                StatusCode::BAD_REQUEST,
                "invalid_query",
                &["is not a percent-escape"],
            );
        }
    }
    let (status, v) = h
        .call(
            Method::PUT,
            "/v1/tenants/%ZZ/handlers/ok/pause",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "invalid_path",
        &[r#""%ZZ" at byte 12"#],
    );
    // A well-formed escape of bytes that are not UTF-8, as before.
    let (status, v) = h
        .call(
            Method::PUT,
            "/v1/tenants/%FF/handlers/ok/pause",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, "invalid_path", &[]);
    let (_, v) = h.call(Method::GET, "/v1/rules", Some(OPERATOR), None).await;
    assert_eq!(v["rules"], json!([]), "nothing stored");
    // Escapes in either case are fine.
    let (status, v) = h
        .call(
            Method::PUT,
            "/v1/tenants/%25ZZ/handlers/o%6b/pause",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!((status, v), (StatusCode::OK, json!({"added": true})));
    let (_, v) = h.call(Method::GET, "/v1/rules", Some(OPERATOR), None).await;
    let rules = v["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "{v}");
    assert_eq!(
        (&rules[0]["tenant"], &rules[0]["handler"]),
        (&json!("%ZZ"), &json!("ok"))
    );
    let (status, _) = h
        .call(
            Method::GET,
            "/v1/events?tenant=%25ZZ&handler=a%2Bb+c",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[test]
fn a_malformed_escape_is_found_in_one_pass() {
    use super::error::{malformed_escape, MalformedEscape};
    let found = |raw| malformed_escape(raw).map(|m: MalformedEscape<'_>| (m.at, m.text));
    assert_eq!(found("/v1/tenants/acme"), None);
    assert_eq!(found("/a%2Fb%c3%A9%25"), None);
    assert_eq!(found(""), None);
    assert_eq!(found("%"), Some((0, "%")));
    assert_eq!(found("ab%4"), Some((2, "%4")));
    assert_eq!(found("%41%ZZ%42"), Some((3, "%ZZ")));
    assert_eq!(found("%%41"), Some((0, "%%4")));
    assert_eq!(found("x%é1"), Some((1, "%é1")));
    assert_eq!(found("x%1é"), Some((1, "%1é")));
}

#[tokio::test]
async fn retry_moves_a_dead_event_back_and_refuses_anything_else() {
    let h = Harness::with_worker(tokens(), |b| {
        b.handler("doomed", |_: Value, _cx: Context| async {
            Err::<(), _>(HandlerError::fail("card declined"))
        })
    })
    .await;
    let id = h
        .emit(
            ACME,
            json!({"tenant": "acme", "handler": "doomed", "payload": 1}),
        )
        .await;
    let path = format!("/v1/events/{id}");
    let mut event = Value::Null;
    for _ in 0..500 {
        event = h.call(Method::GET, &path, Some(ACME), None).await.1;
        if event["state"] == "dead" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(event["state"], "dead", "{event}");
    assert!(
        event["last_error"]
            .as_str()
            .unwrap()
            .contains("card declined"),
        "{event}"
    );
    // The error history: one entry for the one failed attempt.
    let errors = event["errors"].as_array().expect("errors in a shown event");
    assert_eq!(errors.len(), 1, "{event}");
    assert_eq!(errors[0]["attempt"], 1, "{event}");
    assert!(
        errors[0]["error"]
            .as_str()
            .unwrap()
            .contains("card declined"),
        "{event}"
    );
    assert!(errors[0]["at"].as_str().unwrap().ends_with('Z'), "{event}");
    let (status, v) = h
        .call(Method::POST, &format!("{path}/retry"), Some(ACME), None)
        .await;
    assert_eq!(
        (status, v),
        (StatusCode::OK, json!({"id": id, "state": "pending"}))
    );

    let (status, v) = h
        .call(
            Method::POST,
            &format!("/v1/events/{}/retry", herald::EventId::new()),
            Some(ACME),
            None,
        )
        .await;
    assert_error(status, &v, StatusCode::NOT_FOUND, "event_not_found", &[]);
    let (status, v) = h
        .call(Method::POST, "/v1/events/not-an-id/retry", Some(ACME), None)
        .await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, "invalid_id", &["UUID"]);
    let pending = h
        .emit(
            ACME,
            json!({"tenant": "acme", "handler": "elsewhere", "payload": 1}),
        )
        .await;
    let (status, v) = h
        .call(
            Method::POST,
            &format!("/v1/events/{pending}/retry"),
            Some(ACME),
            None,
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::CONFLICT,
        "not_dead",
        &["is pending, not dead"],
    );
    h.stop().await;
}

#[tokio::test]
async fn delete_refuses_a_running_event_and_removes_others() {
    let release = Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    let h = Harness::with_worker(tokens(), move |b| {
        b.handler("slow", move |_: Value, _cx: Context| {
            let r = r.clone();
            async move { r.notified().await }
        })
    })
    .await;
    let id = h
        .emit(
            ACME,
            json!({"tenant": "acme", "handler": "slow", "payload": 1}),
        )
        .await;
    let path = format!("/v1/events/{id}");
    for _ in 0..500 {
        if h.call(Method::GET, &path, Some(ACME), None).await.1["running"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, v) = h.call(Method::DELETE, &path, Some(ACME), None).await;
    assert_error(
        status,
        &v,
        StatusCode::CONFLICT,
        "event_running",
        &["is running", "wait for the run to end"],
    );
    let idle = h
        .emit(
            ACME,
            json!({"tenant": "acme", "handler": "not-here", "payload": 1}),
        )
        .await;
    let (status, v) = h
        .call(
            Method::DELETE,
            &format!("/v1/events/{idle}"),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(
        (status, v),
        (StatusCode::OK, json!({"id": idle, "deleted": true}))
    );
    let (status, v) = h
        .call(
            Method::DELETE,
            &format!("/v1/events/{idle}"),
            Some(ACME),
            None,
        )
        .await;
    assert_error(status, &v, StatusCode::NOT_FOUND, "event_not_found", &[]);
    release.notify_waiters();
    h.stop().await;
}

#[tokio::test]
async fn unpause_and_unblock_report_what_still_holds() {
    let h = Harness::new(tokens()).await;
    let base = "/v1/tenants/acme/handlers/h";
    h.emit(
        ACME,
        json!({"tenant": "acme", "handler": "h", "payload": 1}),
    )
    .await;
    h.emit(
        ACME,
        json!({"tenant": "acme", "handler": "h", "payload": 2}),
    )
    .await;
    assert_eq!(
        h.call(Method::PUT, &format!("{base}/pause"), Some(ACME), None)
            .await
            .1,
        json!({"added": true})
    );
    assert_eq!(
        h.call(Method::PUT, &format!("{base}/pause"), Some(ACME), None)
            .await
            .1,
        json!({"added": false})
    );
    assert_eq!(
        h.call(Method::PUT, &format!("{base}/block"), Some(OPERATOR), None)
            .await
            .1,
        json!({"added": true})
    );
    let (status, v) = h
        .call(Method::DELETE, &format!("{base}/pause"), Some(ACME), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        v,
        json!({"removed": true, "still_held": {"paused": false, "blocked": true}, "notified": 0})
    );
    let (_, v) = h
        .call(
            Method::DELETE,
            &format!("{base}/block"),
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(
        v,
        json!({"removed": true, "still_held": {"paused": false, "blocked": false}, "notified": 2})
    );
    let (_, v) = h
        .call(
            Method::DELETE,
            &format!("{base}/block"),
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(v["removed"], false);
}

#[tokio::test]
async fn stats_and_metrics_show_what_ran() {
    let h = Harness::with_worker(tokens(), |b| {
        b.handler("stats_ok", |_: Value, _cx: Context| async {})
            .handler("stats_flaky", |_: Value, cx: Context| async move {
                if cx.attempt < 2 {
                    return Err(HandlerError::retry_after(
                        "not yet",
                        Duration::from_millis(10),
                    ));
                }
                Ok(())
            })
    })
    .await;
    for n in 0..20 {
        h.emit(
            OPERATOR,
            json!({"tenant": "acme", "handler": "stats_ok", "payload": n}),
        )
        .await;
    }
    h.emit(
        OPERATOR,
        json!({"tenant": "acme", "handler": "stats_flaky", "payload": 0}),
    )
    .await;
    h.emit(
        OPERATOR,
        json!({"tenant": "acme", "handler": "stats_paused", "payload": 0}),
    )
    .await;
    h.call(
        Method::PUT,
        "/v1/tenants/acme/handlers/stats_paused/pause",
        Some(OPERATOR),
        None,
    )
    .await;
    let mut stats = Value::Null;
    for _ in 0..500 {
        stats = h
            .call(Method::GET, "/v1/stats", Some(OPERATOR), None)
            .await
            .1;
        let done = stats["recent"]["handlers"]["stats_ok"]["done_per_second"]
            .as_f64()
            .unwrap_or(0.0)
            * stats["recent"]["window_seconds"].as_f64().unwrap_or(0.0);
        let flaky_done = stats["recent"]["handlers"]["stats_flaky"]["done_per_second"]
            .as_f64()
            .unwrap_or(0.0);
        if done >= 20.0 && flaky_done > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recent = &stats["recent"];
    assert_eq!(
        recent["handlers"]["stats_ok"]["emit_to_start_seconds"]["samples"], 20,
        "{stats}"
    );
    assert!(
        recent["handlers"]["stats_flaky"]["failed_per_second"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{stats}"
    );
    let p50 = recent["emit_to_start_seconds"]["p50"]
        .as_f64()
        .expect("a p50");
    let p99 = recent["emit_to_start_seconds"]["p99"]
        .as_f64()
        .expect("a p99");
    assert!(p50 <= p99 && p99 < 5.0, "{stats}");
    let counts = stats["by_handler"].as_array().unwrap();
    assert_eq!(
        counts.len(),
        1,
        "done events are deleted; the paused one stays: {stats}"
    );
    assert_eq!(counts[0]["handler"], "stats_paused");
    assert!(counts[0]["held"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(
        (&counts[0]["dead"], &counts[0]["done"]),
        (&json!(0), &json!(0))
    );
    assert_eq!(counts[0]["paused"], true);
    assert_eq!(counts[0]["blocked"], false);
    let by_handler = stats["by_handler"].as_array().unwrap();
    assert_eq!(by_handler.len(), 1, "{stats}");
    let row = &by_handler[0];
    assert_eq!(row["handler"], "stats_paused");
    assert_eq!(
        row["held"], 1,
        "a paused handler's events are held: {stats}"
    );
    for n in ["waiting", "running", "delayed", "dead", "done"] {
        assert_eq!(row[n], 0, "{n}: {stats}");
    }
    assert_eq!(row["estimated"], false);
    assert_eq!(row["paused"], true);

    let (status, headers, _, text) = h.raw(Method::GET, "/metrics", None, None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    for line in [
        "herald_events_emitted_total{handler=\"stats_ok\"}",
        "herald_events_done_total{handler=\"stats_ok\"}",
        "herald_events_failed_total{handler=\"stats_flaky\"}",
        "herald_emit_to_start_seconds_bucket{handler=\"stats_ok\",le=",
        "herald_handler_duration_seconds_count{handler=\"stats_ok\"}",
        "herald_runs_in_flight{handler=\"stats_ok\"} 0",
        "# HELP herald_events_emitted_total",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
    h.stop().await;
}

/// The paths of the OpenAPI document, with their methods.
fn documented() -> Vec<(String, String)> {
    let doc: Value = serde_json::from_str(api::OPENAPI).expect("openapi.json is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            out.push((method.to_uppercase(), path.clone()));
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn every_route_is_documented_and_every_documented_route_exists() {
    let mut routed: Vec<(String, String)> = api::route_list()
        .into_iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    routed.sort();
    assert_eq!(
        routed,
        documented(),
        "router (left) and openapi.json (right) differ"
    );

    // And each one really is routed: not the 404 or 405 fallback.
    let h = Harness::new(tokens()).await;
    for (method, path) in documented() {
        let concrete = path
            .replace("{id}", &herald::EventId::new().to_string())
            .replace("{tenant}", "acme")
            .replace("{topic}", "user.signup")
            .replace("{handler}", "h");
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let (status, _, v, _) = h.raw(method.clone(), &concrete, None, None, vec![]).await;
        assert!(
            status != StatusCode::NOT_FOUND || v["error"]["code"] != "not_found",
            "{method} {path} is not routed"
        );
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
    }
}

#[tokio::test]
async fn every_operation_documents_its_errors_as_the_error_schema() {
    let doc: Value = serde_json::from_str(api::OPENAPI).unwrap();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let open = op.get("security").is_some_and(|s| s == &json!([]));
            let responses = op["responses"].as_object().unwrap();
            if !open {
                assert!(
                    responses.contains_key("401"),
                    "{method} {path} documents no 401"
                );
            }
            for (code, r) in responses {
                if code.starts_with('4') || code.starts_with('5') {
                    let r = match r.get("$ref") {
                        Some(Value::String(rf)) => {
                            let name = rf.rsplit('/').next().unwrap();
                            &doc["components"]["responses"][name]
                        }
                        _ => r,
                    };
                    assert_eq!(
                        r["content"]["application/json"]["schema"]["$ref"],
                        "#/components/schemas/Error",
                        "{method} {path} {code}"
                    );
                }
            }
        }
    }
}

#[tokio::test]
async fn the_dashboard_is_served_without_a_token() {
    let h = Harness::new(tokens()).await;
    for (path, kind, needle) in [
        ("/", "text/html", "/ui/app.js"),
        ("/ui/app.js", "text/javascript", "/v1/stats"),
        ("/ui/app.css", "text/css", "body"),
    ] {
        let (status, headers, _, text) = h.raw(Method::GET, path, None, None, vec![]).await;
        assert_eq!(status, StatusCode::OK, "GET {path}");
        let ct = headers[header::CONTENT_TYPE].to_str().unwrap();
        assert!(ct.starts_with(kind), "GET {path}: {ct}");
        assert!(
            headers.contains_key(header::CONTENT_SECURITY_POLICY),
            "GET {path}"
        );
        assert!(text.contains(needle), "GET {path}: no {needle:?}");
    }
    // The page's requests still need the token.
    let (status, _) = h.call(Method::GET, "/v1/stats", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn topics_subscribe_emit_list_and_refuse_a_topic_without_subscribers() {
    let h = Harness::new(tokens()).await;
    let emit = "/v1/tenants/acme/topics/user.signup/events";
    let body = json!({"payload": {"user": 7}, "max_attempts": 4});
    // No subscriber: 422 no_subscribers, nothing stored.
    let (status, v) = h
        .call(Method::POST, emit, Some(ACME), Some(body.clone()))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["code"], "no_subscribers", "{v}");
    let (_, page) = h
        .call(Method::GET, "/v1/events", Some(OPERATOR), None)
        .await;
    assert_eq!(page["events"].as_array().unwrap().len(), 0, "{page}");
    // Every tenant's subscriptions are the operator's to make.
    let all = "/v1/topics/user.signup/subscribers/welcome";
    let (status, v) = h.call(Method::PUT, all, Some(ACME), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let (status, v) = h.call(Method::PUT, all, Some(OPERATOR), None).await;
    assert_eq!((status, &v), (StatusCode::OK, &json!({"added": true})));
    let (_, v) = h.call(Method::PUT, all, Some(OPERATOR), None).await;
    assert_eq!(v, json!({"added": false}));
    // A tenant subscribes its own handler, not another tenant's.
    let own = "/v1/tenants/acme/topics/user.signup/subscribers/crm";
    let (status, v) = h.call(Method::PUT, own, Some(ACME), None).await;
    assert_eq!((status, &v), (StatusCode::OK, &json!({"added": true})));
    let (status, _) = h
        .call(
            Method::PUT,
            "/v1/tenants/beta/topics/user.signup/subscribers/crm",
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, v) = h
        .call(
            Method::GET,
            "/v1/tenants/acme/topics/user.signup/subscribers",
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["handlers"], json!(["crm", "welcome"]));
    assert_eq!(v["subscriptions"].as_array().unwrap().len(), 2, "{v}");
    // The emit: 201, one copy per subscriber, each with the topic.
    let (status, v) = h
        .call(Method::POST, emit, Some(ACME), Some(body.clone()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["topic"], "user.signup");
    let copies = v["events"].as_array().unwrap();
    assert_eq!(copies.len(), 2, "{v}");
    assert_eq!(copies[0]["handler"], "crm");
    assert_eq!(copies[1]["handler"], "welcome");
    for c in copies {
        assert_eq!(c["created"], true);
        let id = c["id"].as_str().unwrap();
        let (status, e) = h
            .call(Method::GET, &format!("/v1/events/{id}"), Some(ACME), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{e}");
        assert_eq!(e["topic"], "user.signup");
        assert_eq!(e["handler"], c["handler"]);
        assert_eq!(e["max_attempts"], 4);
        assert_eq!(e["payload"], json!({"user": 7}));
    }
    // beta gets only the every-tenant copy; acme's token cannot emit for it.
    let (status, _) = h
        .call(
            Method::POST,
            "/v1/tenants/beta/topics/user.signup/events",
            Some(ACME),
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, v) = h
        .call(
            Method::POST,
            "/v1/tenants/beta/topics/user.signup/events",
            Some(BETA),
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["events"].as_array().unwrap().len(), 1);
    // The listing: the operator sees all, a tenant its own and every tenant's.
    let (_, v) = h
        .call(Method::GET, "/v1/topics", Some(OPERATOR), None)
        .await;
    assert_eq!(
        v["subscriptions"],
        json!([
            {"tenant": null, "topic": "user.signup", "handler": "welcome"},
            {"tenant": "acme", "topic": "user.signup", "handler": "crm"},
        ])
    );
    let (_, v) = h.call(Method::GET, "/v1/topics", Some(BETA), None).await;
    assert_eq!(v["subscriptions"].as_array().unwrap().len(), 1, "{v}");
    // Bad input: an unknown field, a bad delay.
    let (status, v) = h
        .call(
            Method::POST,
            emit,
            Some(ACME),
            Some(json!({"payload": 1, "handler": "x"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (status, v) = h
        .call(
            Method::POST,
            emit,
            Some(ACME),
            Some(json!({"payload": 1, "delay": "soon"})),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_delay"))
    );
    // Unsubscribe both: the topic has no subscriber again.
    let (_, v) = h.call(Method::DELETE, own, Some(ACME), None).await;
    assert_eq!(v, json!({"removed": true}));
    let (_, v) = h.call(Method::DELETE, all, Some(OPERATOR), None).await;
    assert_eq!(v, json!({"removed": true}));
    let (_, v) = h.call(Method::DELETE, all, Some(OPERATOR), None).await;
    assert_eq!(v, json!({"removed": false}));
    let (status, v) = h.call(Method::POST, emit, Some(ACME), Some(body)).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("no_subscribers"))
    );
    // Three copies stored in all: acme's two and beta's one.
    let (_, page) = h
        .call(Method::GET, "/v1/events", Some(OPERATOR), None)
        .await;
    assert_eq!(page["events"].as_array().unwrap().len(), 3, "{page}");
}

#[tokio::test]
async fn schedules_are_created_listed_paused_replaced_and_deleted() {
    let h = Harness::new(tokens()).await;
    let base = "/v1/tenants/acme/schedules";
    let body = json!({
        "name": "nightly",
        "handler": "report",
        "cron": "0 30 2 * * *",
        "timezone": "America/New_York",
        "payload": {"kind": "daily"},
        "missed": "each",
        "missed_cap": 3
    });
    let (status, v) = h
        .call(Method::POST, base, Some(ACME), Some(body.clone()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["timezone"], "America/New_York");
    assert_eq!(v["payload"], json!({"kind": "daily"}));
    assert_eq!(v["source"], "api");
    assert_eq!(v["missed"], "each");
    assert_eq!(v["last_event_id"], Value::Null);
    let next = v["next_at"].as_i64().expect("a cursor");
    assert!(next > herald::Millis::now().0);
    let local = v["next_at_local"].as_str().unwrap();
    assert!(
        local.contains("T02:30:00") || local.contains("T03:00:00"),
        "{local}"
    );
    // Twice: a conflict.
    let (status, v) = h.call(Method::POST, base, Some(ACME), Some(body)).await;
    assert_error(
        status,
        &v,
        StatusCode::CONFLICT,
        "schedule_exists",
        &["PUT"],
    );
    // Another tenant's token may not.
    let (status, _) = h.call(Method::GET, base, Some(BETA), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Listed, for the tenant and in the whole list.
    let (_, v) = h.call(Method::GET, base, Some(ACME), None).await;
    assert_eq!(v["schedules"].as_array().unwrap().len(), 1);
    let (_, v) = h
        .call(Method::GET, "/v1/schedules", Some(OPERATOR), None)
        .await;
    assert_eq!(v["schedules"][0]["name"], "nightly");
    let (_, v) = h.call(Method::GET, "/v1/schedules", Some(BETA), None).await;
    assert_eq!(v["schedules"], json!([]));
    // Pause, resume.
    let one = format!("{base}/nightly");
    let (status, v) = h
        .call(Method::POST, &format!("{one}/pause"), Some(ACME), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["paused"], true);
    let (_, v) = h
        .call(Method::POST, &format!("{one}/resume"), Some(ACME), None)
        .await;
    assert_eq!(v["paused"], false);
    // PUT replaces: same cadence keeps the cursor.
    let (status, v) = h
        .call(
            Method::PUT,
            &one,
            Some(ACME),
            Some(json!({"handler": "report", "cron": "0 30 2 * * *", "timezone": "America/New_York", "payload": [1]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["next_at"].as_i64(), Some(next));
    assert_eq!(v["payload"], json!([1]));
    assert_eq!(v["missed"], "once");
    // PUT of a new one creates it, every 30 s.
    let (status, v) = h
        .call(
            Method::PUT,
            &format!("{base}/tick"),
            Some(ACME),
            Some(json!({"handler": "report", "every": "30s"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["every_ms"], 30_000);
    assert_eq!(v["next_at"].as_i64().unwrap() % 30_000, 0);
    // Deleted, then gone.
    let (status, _) = h.call(Method::DELETE, &one, Some(ACME), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, v) = h.call(Method::GET, &one, Some(ACME), None).await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "schedule_not_found",
        &["nightly"],
    );
    let (status, v) = h
        .call(Method::POST, &format!("{one}/pause"), Some(ACME), None)
        .await;
    assert_error(status, &v, StatusCode::NOT_FOUND, "schedule_not_found", &[]);
}

#[tokio::test]
async fn a_bad_schedule_is_refused_naming_the_field_and_nothing_is_stored() {
    let h = Harness::build(tokens(), 100, None).await;
    let base = "/v1/tenants/acme/schedules";
    for (body, field) in [
        (
            json!({"name": "n", "handler": "h", "cron": "61 * * * *"}),
            "cron",
        ),
        (json!({"name": "n", "handler": "h"}), "cron"),
        (json!({"name": "n", "handler": "h", "every": "0s"}), "every"),
        (
            json!({"name": "n", "handler": "h", "every": "soon"}),
            "every",
        ),
        (
            json!({"name": "n", "handler": "h", "every": "1m", "cron": "* * * * *"}),
            "every",
        ),
        (
            json!({"name": "n", "handler": "h", "cron": "* * * * *", "timezone": "Mars/Base"}),
            "timezone",
        ),
        (
            json!({"name": "n", "handler": "h", "cron": "* * * * *", "payload": "x".repeat(200)}),
            "payload",
        ),
        (
            json!({"name": "n", "handler": "h", "cron": "* * * * *", "missed": "each"}),
            "missed_cap",
        ),
        (
            json!({"name": "n", "handler": "h", "cron": "* * * * *", "max_attempts": 0}),
            "max_attempts",
        ),
        (json!({"handler": "h", "cron": "* * * * *"}), "name"),
    ] {
        let (status, v) = h.call(Method::POST, base, Some(ACME), Some(body)).await;
        assert_error(
            status,
            &v,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_schedule",
            &[&format!("{field}:")],
        );
    }
    let (status, v) = h
        .call(
            Method::POST,
            base,
            Some(ACME),
            Some(json!({"name": "n", "handler": "", "cron": "* * * * *"})),
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_schedule",
        &["handler:"],
    );
    let (_, v) = h.call(Method::GET, base, Some(ACME), None).await;
    assert_eq!(v["schedules"], json!([]), "nothing stored");
}

/// Polls `GET path` as acme until `done` holds of the event (10 s at most).
async fn event_until(h: &Harness, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let mut event = Value::Null;
    for _ in 0..500 {
        event = h.call(Method::GET, path, Some(ACME), None).await.1;
        if done(&event) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    event
}

#[tokio::test]
async fn a_limit_is_set_listed_and_removed_and_an_event_says_it_waits_for_it() {
    let h = Harness::with_worker(tokens(), |b| {
        b.handler("sync", |_: Value, cx: Context| async move {
            cx.cancelled().await;
        })
    })
    .await;
    let limit = |body: Value| async {
        h.call(Method::PUT, "/v1/limits", Some(OPERATOR), Some(body))
            .await
    };
    let per_key = json!({"handler": "sync", "per": "key", "running": 1});
    let (status, v) = limit(per_key.clone()).await;
    assert_eq!(
        (status, &v["changed"]),
        (StatusCode::OK, &json!(true)),
        "{v}"
    );
    let (_, v) = limit(per_key).await;
    assert_eq!(v["changed"], json!(false), "already so: {v}");
    // A tenant sets its own tenant's limits, not the defaults nor another's.
    let own =
        json!({"handler": "sync", "per": "key", "tenant": "acme", "key": "vip", "running": 3});
    let (status, v) = h
        .call(Method::PUT, "/v1/limits", Some(ACME), Some(own.clone()))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, _) = h
        .call(Method::PUT, "/v1/limits", Some(BETA), Some(own))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let every = json!({"handler": "sync", "per": "tenant", "running": 3});
    let (status, _) = h
        .call(Method::PUT, "/v1/limits", Some(ACME), Some(every))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for (body, words) in [
        (
            json!({"handler": "sync", "per": "everyone", "running": 1}),
            vec!["per", "everyone"],
        ),
        (
            json!({"handler": "sync", "per": "handler", "tenant": "acme", "running": 1}),
            vec!["takes neither"],
        ),
        (
            json!({"handler": "sync", "per": "handler", "running": 0}),
            vec!["pause"],
        ),
        (
            json!({"handler": "sync", "per": "handler", "running": 100001}),
            vec!["at most"],
        ),
    ] {
        let (status, v) = limit(body).await;
        assert_error(
            status,
            &v,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_limit",
            &words,
        );
    }
    let (status, v) = h.call(Method::GET, "/v1/limits", Some(ACME), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        v["limits"],
        json!([
            {"handler": "sync", "per": "key", "running": 1, "source": "api"},
            {"handler": "sync", "per": "key", "tenant": "acme", "key": "vip", "running": 3, "source": "api"},
        ])
    );
    // Two events of one key: one runs, the other waits, and says so.
    let event =
        json!({"tenant": "acme", "handler": "sync", "payload": {}, "concurrency_key": "k9"});
    let first = h.emit(ACME, event.clone()).await;
    let first = event_until(&h, &format!("/v1/events/{first}"), |e| {
        e["running"] == json!(true)
    })
    .await;
    assert_eq!(first["concurrency_key"], "k9", "{first}");
    let second = h.emit(ACME, event).await;
    let path = format!("/v1/events/{second}");
    let waiting = event_until(&h, &path, |e| !e["waiting_for"].is_null()).await;
    assert_eq!(
        waiting["waiting_for"],
        json!({"per": "key", "tenant": "acme", "key": "k9", "running": 1, "limit": 1,
               "reason": "1 of 1 running for key \"k9\" of handler \"sync\""}),
        "{waiting}"
    );
    // Removing the limit lets it run.
    let (status, v) = h
        .call(
            Method::DELETE,
            "/v1/limits?handler=sync&per=key",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(
        (status, &v["removed"]),
        (StatusCode::OK, &json!(true)),
        "{v}"
    );
    let ran = event_until(&h, &path, |e| e["running"] == json!(true)).await;
    assert_eq!(
        ran["running"],
        json!(true),
        "woken when its limit went: {ran}"
    );
    assert!(ran["waiting_for"].is_null(), "{ran}");
    let (_, v) = h
        .call(
            Method::DELETE,
            "/v1/limits?handler=sync&per=key",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(v["removed"], json!(false));
    h.stop().await;
}

#[tokio::test]
async fn a_singleton_keeps_or_replaces_and_a_rate_says_until_when() {
    let h = Harness::new(tokens()).await;
    let event = |keep: &str| {
        json!({"tenant": "acme", "handler": "digest", "payload": {},
               "singleton": {"key": "user-7", "keep": keep}})
    };
    let first = h.emit(ACME, event("oldest")).await;
    let (status, v) = h
        .call(
            Method::POST,
            "/v1/events",
            Some(ACME),
            Some(event("oldest")),
        )
        .await;
    assert_eq!(
        (status, &v["id"], &v["created"]),
        (StatusCode::OK, &json!(first), &json!(false)),
        "{v}"
    );
    let newest = h.emit(ACME, event("newest")).await;
    assert_ne!(newest, first);
    let (status, _) = h
        .call(
            Method::GET,
            &format!("/v1/events/{first}"),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "replaced");
    let (status, v) = h
        .call(
            Method::POST,
            "/v1/events",
            Some(ACME),
            Some(json!({"tenant": "acme", "handler": "digest", "payload": {},
                        "singleton": {"key": "user-7", "keep": "latest"}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let message = v["error"]["message"].as_str().expect("a message");
    assert!(message.contains("latest"), "{v}");
    // A rate is set like a limit, and shown.
    let (status, v) = h
        .call(
            Method::PUT,
            "/v1/limits",
            Some(OPERATOR),
            Some(json!({"handler": "digest", "per": "tenant", "rate": {"starts": 2, "period": "1m", "burst": 1}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_, v) = h
        .call(
            Method::GET,
            "/v1/limits?handler=digest",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(
        v["limits"],
        json!([{"handler": "digest", "per": "tenant", "rate": {"starts": 2, "period": "1m"}, "source": "api"}])
    );
    let (status, v) = h
        .call(
            Method::PUT,
            "/v1/limits",
            Some(OPERATOR),
            Some(json!({"handler": "digest", "per": "tenant", "rate": {"starts": 2, "period": "soon"}})),
        )
        .await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_limit",
        &["soon"],
    );
    h.stop().await;
}
