//! Where a round's events are emitted and looked up.

use std::collections::HashMap;
use std::sync::Arc;

use herald::{Client, EmitOptions, EmitRequest, EventId, Queue};

/// Where the events are emitted and looked up: through the library on
/// PostgreSQL + NATS (fleet), or through the one worker's HTTP API
/// (restart: the in-process queue is inside the worker).
pub(super) enum Front {
    Library(Client, Arc<dyn Queue>),
    Api(reqwest::Client, String),
}

impl Front {
    pub(super) async fn emit(&self, round: usize, n: usize) -> Vec<EventId> {
        match self {
            Front::Library(client, _) => {
                let batch: Vec<EmitRequest> = (0..n)
                    .map(|i| EmitRequest {
                        tenant: "bench".into(),
                        handler: "hold".into(),
                        payload: format!(r#"{{"round":{round},"i":{i}}}"#),
                        options: EmitOptions::default(),
                    })
                    .collect();
                client
                    .emit_batch(batch)
                    .await
                    .expect("emit")
                    .into_iter()
                    .map(|e| e.id())
                    .collect()
            }
            Front::Api(http, base) => {
                let events: Vec<serde_json::Value> = (0..n)
                    .map(|i| {
                        serde_json::json!({"tenant": "bench", "handler": "hold", "payload": {"round": round, "i": i}})
                    })
                    .collect();
                let res = http
                    .post(format!("{base}/v1/events/batch"))
                    .json(&serde_json::json!({ "events": events }))
                    .send()
                    .await
                    .expect("emit through the API");
                assert_eq!(
                    res.status(),
                    201,
                    "emit: {}",
                    res.text().await.unwrap_or_default()
                );
                let body: serde_json::Value = res.json().await.expect("emit answer");
                body["results"]
                    .as_array()
                    .expect("results")
                    .iter()
                    .map(|r| {
                        r["id"]
                            .as_str()
                            .expect("an id")
                            .parse()
                            .expect("an event id")
                    })
                    .collect()
            }
        }
    }

    /// Whether the event is still stored.
    pub(super) async fn stored(&self, id: EventId) -> bool {
        match self {
            Front::Library(client, _) => client.get(id).await.expect("get").is_some(),
            Front::Api(http, base) => {
                let res = http
                    .get(format!("{base}/v1/events/{id}"))
                    .send()
                    .await
                    .expect("GET the event");
                res.status() != 404
            }
        }
    }

    /// The lease's expiry (wall clock, ms) of each event, read now.
    pub(super) async fn lease_expiries(&self, ids: &[String]) -> HashMap<String, i64> {
        let mut out = HashMap::new();
        if let Front::Library(client, _) = self {
            for k in ids {
                let id: EventId = k.parse().expect("an event id");
                let event = client
                    .get(id)
                    .await
                    .expect("get")
                    .expect("the event exists");
                out.insert(
                    k.clone(),
                    event.lease.map(|l| l.expires_at.0).unwrap_or(i64::MIN),
                );
            }
        }
        out
    }
}
