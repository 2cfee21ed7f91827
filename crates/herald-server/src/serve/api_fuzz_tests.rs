//! Bounded fuzzing of the HTTP API through the real router: arbitrary
//! paths, query strings, headers and bodies on every route never make it
//! panic or answer 500, and every refusal is a 4xx with the JSON error.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request};
use axum::Router;
use herald::{Client, MemoryQueue};
use herald_sqlite::SqliteStore;
use proptest::prelude::*;
use serde_json::Value;
use tower::ServiceExt;

use super::api::{self, AppState};
use super::auth::Tokens;
use super::recent::Tracker;
use super::telemetry;
use crate::config::AuthConfig;

fn router(dir: &tempfile::TempDir) -> Router {
    let store = Arc::new(SqliteStore::open(dir.path().join("api.db")).unwrap());
    let queue = Arc::new(MemoryQueue::default());
    let state = Arc::new(AppState {
        schedules: store.clone(),
        client: Client::new(store, queue).max_payload(64 * 1024),
        tokens: Tokens::new(&AuthConfig::default()),
        tracker: Arc::new(Tracker::default()),
        metrics: telemetry::install().unwrap(),
        max_batch: 100,
        max_request_bytes: 128 * 1024,
        handlers: vec!["send_email".into()],
    });
    api::router(state)
}

/// A path segment: a plausible name, an id, or anything percent-encoded.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("acme".to_string()),
        Just("send_email".to_string()),
        Just(herald::EventId::new().to_string()),
        "[a-zA-Z0-9_.~-]{0,70}",
        any::<String>().prop_map(|s| {
            s.bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect()
        }),
        "%[0-9A-Fa-f]{2}%[0-9A-Fa-f]{2}",
    ]
}

/// A route of the API with its parameters filled in, or a path of its own.
fn path() -> impl Strategy<Value = (Method, String)> {
    let routes = api::route_list();
    let known =
        (0..routes.len(), proptest::collection::vec(segment(), 3)).prop_map(move |(i, segs)| {
            let (method, template) = routes[i].clone();
            let mut path = String::new();
            let mut n = 0;
            for part in template.split('/').skip(1) {
                path.push('/');
                if part.starts_with('{') {
                    path.push_str(&segs[n % segs.len()]);
                    n += 1;
                } else {
                    path.push_str(part);
                }
            }
            (method, path)
        });
    let method = prop_oneof![
        Just(Method::GET),
        Just(Method::POST),
        Just(Method::PUT),
        Just(Method::DELETE),
        Just(Method::PATCH),
        Just(Method::HEAD),
        Just(Method::OPTIONS),
    ];
    prop_oneof![
        4 => known,
        1 => (method, "/v1(/[a-z{}%0-9]{0,8}){0,5}"),
    ]
}

/// A query string: the API's own parameters with any values, or junk.
fn query() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("limit"),
        Just("cursor"),
        Just("state"),
        Just("tenant"),
        Just("handler"),
        Just("topic"),
        Just("after"),
        Just("before"),
        Just("x"),
    ];
    let value = prop_oneof![
        "-?[0-9]{0,25}",
        "[a-z_]{0,10}",
        Just(herald::EventId::new().to_string()),
        "%[0-9A-F]{2}[a-z]{0,3}",
        "[&=;#+ ]{0,3}",
    ];
    prop_oneof![
        Just(String::new()),
        proptest::collection::vec((key, value), 1..4).prop_map(|kv| {
            let q: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("?{}", q.join("&"))
        }),
        "\\?[ -~]{0,30}".prop_map(|q| q.replace(' ', "%20").replace('#', "%23")),
    ]
}

/// Any JSON, nested a little.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        "[a-z_]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        let key = prop_oneof![
            Just("tenant".to_string()),
            Just("handler".to_string()),
            Just("payload".to_string()),
            Just("events".to_string()),
            Just("run_at".to_string()),
            Just("delay".to_string()),
            Just("max_attempts".to_string()),
            Just("idempotency_key".to_string()),
            Just("cron".to_string()),
            Just("timezone".to_string()),
            Just("every".to_string()),
            Just("missed".to_string()),
            Just("name".to_string()),
            "[a-z_]{0,8}",
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(key, inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn body() -> impl Strategy<Value = (Option<&'static str>, Vec<u8>)> {
    let content_type = prop_oneof![
        Just(None),
        Just(Some("application/json")),
        Just(Some("application/json; charset=utf-8")),
        Just(Some("text/plain")),
        Just(Some("application/x-www-form-urlencoded")),
        Just(Some("application/json\u{1}")),
    ];
    let bytes = prop_oneof![
        Just(Vec::new()),
        json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        proptest::collection::vec(any::<u8>(), 0..64),
        "[{}\\[\\]\",:0-9a-z ]{0,40}".prop_map(String::into_bytes),
    ];
    (content_type, bytes)
}

fn authorization() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        4 => Just(None),
        1 => "Bearer [ -~]{0,20}".prop_map(|s| Some(s.into_bytes())),
        1 => proptest::collection::vec(any::<u8>(), 0..20).prop_map(Some),
    ]
}

#[test]
fn arbitrary_requests_get_no_500_and_refusals_are_json() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let app = rt.block_on(async { router(&dir) });
    let config = ProptestConfig::with_cases(1_000);
    proptest!(config, |((method, path) in path(), query in query(), (content_type, body) in body(), auth in authorization())| {
        let uri = format!("{path}{query}");
        let mut req = Request::builder().method(method.clone()).uri(&uri);
        if let Some(ct) = content_type {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        if let Some(a) = &auth {
            if let Ok(v) = header::HeaderValue::from_bytes(a) {
                req = req.header(header::AUTHORIZATION, v);
            }
        }
        // A URI the http crate refuses never reaches the server.
        let Ok(req) = req.body(Body::from(body.clone())) else { return Ok(()) };
        let (status, bytes) = rt.block_on(async {
            let response = app.clone().oneshot(req).await.unwrap();
            let status = response.status();
            (status, axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap())
        });
        let text = String::from_utf8_lossy(&bytes);
        prop_assert!(!status.is_server_error(), "{method} {uri} {body:?}: {status} {text}");
        if status.is_client_error() && method != Method::HEAD {
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|e| TestCaseError::fail(format!("{method} {uri}: {status} not JSON ({e}): {text}")))?;
            prop_assert!(v["error"]["code"].is_string(), "{method} {uri}: {status} {text}");
            prop_assert!(v["error"]["message"].is_string(), "{method} {uri}: {status} {text}");
        }
    });
}
