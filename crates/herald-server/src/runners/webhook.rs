//! The webhook handler: POST each event, signed, to a URL.
//!
//! # The request
//!
//! ```text
//! POST <url>
//! Content-Type: application/json
//! Herald-Event-Id: 0190f5c2-…
//! Herald-Lease-Token: 5d1c9a3e-…
//! Herald-Timestamp: 1718900000
//! Herald-Signature: v1=5d2f…
//!
//! {"id":"0190f5c2-…","tenant":"acme","handler":"send_email","attempt":1,"max_attempts":10,"payload":{…}}
//! ```
//!
//! `payload` is the event's payload exactly as it was emitted (not
//! re-encoded). `attempt` counts from 1; a retry of the same event carries
//! the same `id`, so a receiver that must act once keys on it.
//!
//! # The signature
//!
//! `Herald-Signature` is `v1=` followed by the lowercase hex HMAC-SHA256,
//! keyed with the handler's secret, of the bytes `{timestamp}.{body}`: the
//! `Herald-Timestamp` header's decimal text, a dot, and the raw request body
//! as received. To verify, a receiver:
//!
//! 1. recomputes the HMAC over the timestamp header, `.`, and the raw body
//!    (before any JSON parsing: re-encoding changes the bytes);
//! 2. compares it with the header in constant time;
//! 3. rejects timestamps more than a few minutes from its own clock, so a
//!    captured request cannot be replayed later.
//!
//! ```ignore
//! use hmac::{Hmac, Mac};
//! use sha2::Sha256;
//!
//! fn verify(secret: &[u8], timestamp: &str, body: &[u8], header: &str, now: u64) -> bool {
//!     let Some(hex_sig) = header.strip_prefix("v1=") else { return false };
//!     let Ok(sig) = hex::decode(hex_sig) else { return false };
//!     let fresh = timestamp.parse::<u64>().is_ok_and(|t| now.abs_diff(t) <= 300);
//!     let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
//!     mac.update(timestamp.as_bytes());
//!     mac.update(b".");
//!     mac.update(body);
//!     fresh && mac.verify_slice(&sig).is_ok() // constant-time
//! }
//! ```
//!
//! The same check in a shell: `printf '%s.%s' "$TS" "$BODY" | openssl dgst
//! -sha256 -hmac "$SECRET"` prints the hex after `v1=`. (The tests of this
//! module verify received requests with exactly the function above.)
//!
//! # The answer
//!
//! | answer | outcome |
//! |---|---|
//! | 2xx | done |
//! | 429 or 503 with `Retry-After` (seconds or an HTTP date) | snooze that long (the attempt is given back) |
//! | 429 or 503 without a usable `Retry-After` | retry with backoff |
//! | 408, 423, 425 | retry with backoff |
//! | any other 4xx | **fail**: dead at once (see [`classify`]) |
//! | anything else (5xx, 3xx: redirects are not followed) | retry with backoff |
//! | no connection, or no answer within `timeout` | retry with backoff |
//!
//! The error recorded on the event says which: `webhook answered 500
//! Internal Server Error: <the first 500 bytes of the body>`, `webhook
//! connection failed: …`, `webhook timed out after 30s`.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use hmac::{Hmac, Mac};
use reqwest::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::Sha256;

use super::{show, ConfigError, EventMeta};
use herald::escape::escaped;
use herald::{Context, Outcome};

/// The most of a failed answer's body kept in the event's error.
const BODY_HEAD: usize = 500;

/// `kind = "webhook"`: the settings of a webhook handler.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Where to POST events: an absolute `http://` or `https://` URL.
    pub url: String,
    /// The HMAC key itself. Prefer `secret_env`, which keeps it out of the
    /// config file. Exactly one of the two must be set.
    #[serde(default)]
    pub secret: Option<Secret>,
    /// The name of the environment variable holding the HMAC key, read when
    /// the handler is built.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// How long one delivery may take, from connecting to the status line
    /// (and, for a failure, the start of the body). Default 30 s.
    #[serde(
        default = "default_timeout",
        deserialize_with = "super::human_duration"
    )]
    pub timeout: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

/// A secret from the config file: usable, but never printed by `Debug`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Delivers events to a URL by HTTP POST; see the [module docs](self).
pub struct WebhookHandler {
    url: Url,
    key: Vec<u8>,
    timeout: Duration,
    client: reqwest::Client,
}

impl WebhookHandler {
    /// Checks `config` (for handler `name`, which errors name) and makes
    /// the handler: the URL must be absolute http(s), the secret set and
    /// non-empty, the timeout above zero.
    pub fn new(name: &str, config: &WebhookConfig) -> Result<Self, ConfigError> {
        let url = Url::parse(&config.url).map_err(|e| ConfigError::key(name, "url", e))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ConfigError::key(
                name,
                "url",
                format!("expected an http or https URL, not {}:", url.scheme()),
            ));
        }
        let key =
            match (&config.secret, &config.secret_env) {
                (Some(_), Some(_)) => {
                    return Err(ConfigError::key(
                        name,
                        "secret",
                        "set either `secret` or `secret_env`, not both",
                    ))
                }
                (None, None) => return Err(ConfigError::key(
                    name,
                    "secret_env",
                    "missing: set `secret_env` to the name of an environment variable holding the \
                     HMAC key (or `secret` to the key itself); requests are always signed",
                )),
                (Some(secret), None) => secret.0.clone(),
                (None, Some(var)) => std::env::var(var).map_err(|e| {
                    ConfigError::key(
                        name,
                        "secret_env",
                        format!("environment variable {var}: {e}"),
                    )
                })?,
            };
        if key.is_empty() {
            let which = if config.secret.is_some() {
                "secret"
            } else {
                "secret_env"
            };
            return Err(ConfigError::key(name, which, "the secret is empty"));
        }
        if config.timeout.is_zero() {
            return Err(ConfigError::key(name, "timeout", "must be more than zero"));
        }
        let client = reqwest::Client::builder()
            .user_agent(concat!("herald/", env!("CARGO_PKG_VERSION")))
            // A redirected POST would arrive as a GET without its body.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ConfigError::key(name, "", format!("cannot make an HTTP client: {e}")))?;
        Ok(WebhookHandler {
            url,
            key: key.into_bytes(),
            timeout: config.timeout,
            client,
        })
    }

    /// Delivers one event; gives up with `Snooze(0)` (the attempt is given
    /// back, as for any cancelled run) as soon as `cancelled` resolves,
    /// dropping the request.
    pub(crate) async fn deliver(
        &self,
        payload: &str,
        meta: &EventMeta,
        cancelled: impl Future<Output = ()>,
    ) -> Outcome {
        let payload: &RawValue = match serde_json::from_str(payload) {
            Ok(p) => p,
            // The same payload will not become JSON on a retry.
            Err(e) => return Outcome::fail(format!("the payload is not JSON: {e}")),
        };
        let body = serde_json::to_vec(&Body {
            id: &meta.event_id,
            tenant: &meta.tenant,
            handler: &meta.handler,
            attempt: meta.attempt,
            max_attempts: meta.max_attempts,
            payload,
        })
        .expect("a struct of strings, numbers and valid JSON serializes");
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("Herald-Event-Id", &meta.event_id)
            .header("Herald-Lease-Token", &meta.lease_token)
            .header("Herald-Timestamp", timestamp.to_string())
            .header("Herald-Signature", signature(&self.key, timestamp, &body))
            .body(body);
        let exchange = async {
            let response = request.send().await?;
            let status = response.status();
            let retry_after = response.headers().get(RETRY_AFTER).cloned();
            let head = if status.is_success() {
                String::new()
            } else {
                body_head(response).await
            };
            Ok::<_, reqwest::Error>((status, retry_after, head))
        };
        let outcome = tokio::select! {
            _ = cancelled => return Outcome::Snooze(Duration::ZERO),
            r = tokio::time::timeout(self.timeout, exchange) => match r {
                Err(_) => Outcome::retry(format!("webhook timed out after {}", show(self.timeout))),
                // Without the URL: its query may hold a token, and the event's
                // error is shown to whoever can list events.
                Ok(Err(e)) if e.is_connect() => {
                    Outcome::retry(format!("webhook connection failed: {}", chain(&e.without_url())))
                }
                Ok(Err(e)) => {
                    Outcome::retry(format!("webhook request failed: {}", chain(&e.without_url())))
                }
                Ok(Ok((status, retry_after, head))) => {
                    classify(status, retry_after.as_ref(), &head, SystemTime::now())
                }
            },
        };
        tracing::debug!(
            handler = %escaped(&meta.handler), event = %meta.event_id, attempt = meta.attempt, ?outcome,
            "webhook delivered"
        );
        outcome
    }
}

#[async_trait]
impl herald::Handler for WebhookHandler {
    async fn call(&self, payload: &str, cx: Context) -> Outcome {
        self.deliver(payload, &EventMeta::from(&cx), cx.cancelled())
            .await
    }
}

/// The request body.
#[derive(Serialize)]
struct Body<'a> {
    id: &'a str,
    tenant: &'a str,
    handler: &'a str,
    attempt: u32,
    max_attempts: u32,
    payload: &'a RawValue,
}

/// The `Herald-Signature` header for a body sent at `timestamp` (unix
/// seconds): `v1=` and the hex HMAC-SHA256 of `{timestamp}.{body}`.
pub fn signature(key: &[u8], timestamp: u64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// What an answer means for the event.
///
/// **Most 4xx fail the event for good** (it goes dead at once, keeping the
/// answer as its error, where an operator can inspect it and retry it).
/// Why: a 4xx says the *request* is at fault, and the request herald sends
/// for an event is the same on every attempt (same URL, same payload, same
/// key), so repeating it would get the same answer ten times over about
/// eight minutes, then go dead anyway. It also gives the receiver a way to
/// refuse an event it can never process (a 400 or 422 for a payload it does
/// not accept) without answering 2xx and losing the record. Dead events are
/// kept (7 days by default) and can be retried once the cause is fixed, so
/// failing loses nothing. The receiver picks: 2xx = done, 4xx = give up,
/// 5xx = try again.
///
/// The exceptions are the 4xx codes that are about timing, not about the
/// request: 408 Request Timeout, 423 Locked, 425 Too Early and 429 Too Many
/// Requests retry with backoff (429 snoozes instead when it says how long).
///
/// 429 and 503 with a `Retry-After` (delta seconds or an HTTP date) snooze
/// that long; the attempt is given back, as the receiver asked for a pause,
/// not reported a failure. Anything else that is not 2xx retries with
/// backoff, 3xx included: redirects are not followed, as a redirected POST
/// arrives as a GET without its body.
pub(crate) fn classify(
    status: StatusCode,
    retry_after: Option<&HeaderValue>,
    head: &str,
    now: SystemTime,
) -> Outcome {
    if status.is_success() {
        return Outcome::Done;
    }
    let error = if head.is_empty() {
        format!("webhook answered {status}")
    } else {
        format!("webhook answered {status}: {head}")
    };
    match status.as_u16() {
        429 | 503 => match retry_after.and_then(|v| parse_retry_after(v, now)) {
            Some(d) => Outcome::Snooze(d),
            None => Outcome::retry(error),
        },
        408 | 423 | 425 => Outcome::retry(error),
        400..=499 => Outcome::fail(error),
        _ => Outcome::retry(error),
    }
}

/// A `Retry-After` value as a wait from `now`: delta seconds, or an HTTP
/// date (a date in the past means "now"). `None` when it is neither.
pub(crate) fn parse_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The start of a failed answer's body, as text, for the event's error.
/// Reads no more than it keeps.
async fn body_head(mut response: reqwest::Response) -> String {
    let mut head = Vec::new();
    while head.len() < BODY_HEAD {
        match response.chunk().await {
            Ok(Some(chunk)) => head.extend_from_slice(&chunk),
            Ok(None) => break,
            // The status is what matters; a body cut short is still useful.
            Err(_) => break,
        }
    }
    head.truncate(BODY_HEAD);
    String::from_utf8_lossy(&head).trim().to_string()
}

/// An error and its causes, `: `-separated (reqwest's own message alone is
/// "error sending request", the cause says why).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
pub(crate) mod tests {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use axum::body::Bytes;
    use axum::http::HeaderMap;
    use axum::response::{IntoResponse, Response};

    use super::*;

    pub(crate) const SECRET: &str = "whsec_test_0123456789";

    /// A request the test server received.
    #[derive(Clone, Debug)]
    pub(crate) struct Received {
        pub headers: HeaderMap,
        pub body: Vec<u8>,
    }

    impl Received {
        pub fn header(&self, name: &str) -> &str {
            self.headers
                .get(name)
                .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
                .to_str()
                .unwrap()
        }

        pub fn json(&self) -> serde_json::Value {
            serde_json::from_slice(&self.body).unwrap()
        }
    }

    /// A real HTTP server on 127.0.0.1 (a random port) that records every
    /// POST to `/hook` and answers with `answer`.
    pub(crate) struct TestServer {
        pub url: String,
        pub received: Arc<Mutex<Vec<Received>>>,
    }

    impl TestServer {
        pub fn received(&self) -> Vec<Received> {
            self.received.lock().unwrap().clone()
        }
    }

    pub(crate) async fn serve<F, Fut>(answer: F) -> TestServer
    where
        F: Fn() -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                log.lock().unwrap().push(Received {
                    headers,
                    body: body.to_vec(),
                });
                answer()
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        TestServer {
            url: format!("http://{addr}/hook"),
            received,
        }
    }

    /// The receiver's check, exactly as documented in the module docs.
    pub(crate) fn verify(
        secret: &[u8],
        timestamp: &str,
        body: &[u8],
        header: &str,
        now: u64,
    ) -> bool {
        let Some(hex_sig) = header.strip_prefix("v1=") else {
            return false;
        };
        let Ok(sig) = hex::decode(hex_sig) else {
            return false;
        };
        let fresh = timestamp
            .parse::<u64>()
            .is_ok_and(|t| now.abs_diff(t) <= 300);
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        fresh && mac.verify_slice(&sig).is_ok()
    }

    pub(crate) fn unix_now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn config(url: &str) -> WebhookConfig {
        WebhookConfig {
            url: url.into(),
            secret: Some(Secret(SECRET.into())),
            secret_env: None,
            timeout: Duration::from_secs(10),
        }
    }

    fn handler(url: &str) -> WebhookHandler {
        WebhookHandler::new("send_email", &config(url)).unwrap()
    }

    fn meta() -> EventMeta {
        EventMeta {
            event_id: herald::EventId::new().to_string(),
            tenant: "acme".into(),
            handler: "send_email".into(),
            attempt: 2,
            max_attempts: 10,
            lease_token: herald::LeaseToken::new().0.to_string(),
        }
    }

    const PAYLOAD: &str = r#"{"to": "ada@example.com",  "n": 1.50}"#;

    async fn deliver(h: &WebhookHandler) -> Outcome {
        h.deliver(PAYLOAD, &meta(), std::future::pending()).await
    }

    /// The outcome of one delivery to a server that always answers `answer`.
    async fn answered<R: IntoResponse + Clone + Send + Sync + 'static>(answer: R) -> Outcome {
        let server = serve(move || {
            let r = answer.clone();
            async move { r.into_response() }
        })
        .await;
        deliver(&handler(&server.url)).await
    }

    #[tokio::test]
    async fn a_2xx_is_done_and_the_signature_verifies_with_the_secret_and_the_body_received() {
        let server = serve(|| async { axum::http::StatusCode::NO_CONTENT.into_response() }).await;
        let h = handler(&server.url);
        let meta = meta();
        let out = h.deliver(PAYLOAD, &meta, std::future::pending()).await;
        assert_eq!(out, Outcome::Done);

        let got = server.received();
        assert_eq!(got.len(), 1);
        let r = &got[0];
        assert_eq!(r.header("content-type"), "application/json");
        assert_eq!(r.header("herald-event-id"), meta.event_id);
        assert_eq!(r.header("herald-lease-token"), meta.lease_token);
        let ts = r.header("herald-timestamp");
        assert!(ts.parse::<u64>().unwrap().abs_diff(unix_now()) <= 5, "{ts}");
        let sig = r.header("herald-signature");
        assert!(
            verify(SECRET.as_bytes(), ts, &r.body, sig, unix_now()),
            "{sig}"
        );
        // Another key, another body or another timestamp do not verify.
        assert!(!verify(b"another key", ts, &r.body, sig, unix_now()));
        let mut tampered = r.body.clone();
        tampered[10] ^= 1;
        assert!(!verify(SECRET.as_bytes(), ts, &tampered, sig, unix_now()));
        let older = (ts.parse::<u64>().unwrap() - 1).to_string();
        assert!(!verify(SECRET.as_bytes(), &older, &r.body, sig, unix_now()));
        // A replay long after is refused by the timestamp check.
        assert!(!verify(
            SECRET.as_bytes(),
            ts,
            &r.body,
            sig,
            unix_now() + 3600
        ));

        let body = r.json();
        assert_eq!(body["id"], meta.event_id.as_str());
        assert_eq!(body["tenant"], "acme");
        assert_eq!(body["handler"], "send_email");
        assert_eq!(body["attempt"], 2);
        assert_eq!(body["max_attempts"], 10);
        // The payload is passed through byte for byte, not re-encoded.
        let text = String::from_utf8(r.body.clone()).unwrap();
        assert!(
            text.ends_with(&format!(r#""payload":{PAYLOAD}}}"#)),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_503_with_retry_after_in_seconds_snoozes_that_long() {
        let out = answered((
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "7")],
        ))
        .await;
        assert_eq!(out, Outcome::Snooze(Duration::from_secs(7)));
    }

    #[tokio::test]
    async fn a_429_with_an_http_date_retry_after_snoozes_until_then() {
        let at = SystemTime::now() + Duration::from_secs(120);
        let date = httpdate::fmt_http_date(at);
        let out = answered((
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", date.clone())],
        ))
        .await;
        let Outcome::Snooze(d) = out else {
            panic!("{out:?} for Retry-After: {date}")
        };
        assert!(
            (Duration::from_secs(117)..=Duration::from_secs(120)).contains(&d),
            "{d:?}"
        );
    }

    #[tokio::test]
    async fn a_429_or_503_without_a_usable_retry_after_retries() {
        for (status, retry_after) in [
            (axum::http::StatusCode::SERVICE_UNAVAILABLE, None),
            (axum::http::StatusCode::TOO_MANY_REQUESTS, None),
            (axum::http::StatusCode::TOO_MANY_REQUESTS, Some("soon")),
        ] {
            let mut response = status.into_response();
            if let Some(v) = retry_after {
                response
                    .headers_mut()
                    .insert("retry-after", HeaderValue::from_static(v));
            }
            let response = Arc::new(Mutex::new(Some(response)));
            let server = serve(move || {
                let r = response.lock().unwrap().take().unwrap();
                async move { r }
            })
            .await;
            let out = deliver(&handler(&server.url)).await;
            assert_eq!(out, Outcome::retry(format!("webhook answered {status}")));
        }
    }

    #[test]
    fn retry_after_in_the_past_or_malformed() {
        let now = SystemTime::now();
        let past = HeaderValue::from_str(&httpdate::fmt_http_date(now - Duration::from_secs(60)));
        assert_eq!(parse_retry_after(&past.unwrap(), now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after(&HeaderValue::from_static(" 30 "), now),
            Some(Duration::from_secs(30))
        );
        for bad in ["-1", "1.5", "tomorrow", ""] {
            assert_eq!(
                parse_retry_after(&HeaderValue::from_static(bad), now),
                None,
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn a_500_retries_with_the_status_and_the_start_of_the_body() {
        let out = answered((
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "the database is on fire\n",
        ))
        .await;
        assert_eq!(
            out,
            Outcome::retry("webhook answered 500 Internal Server Error: the database is on fire")
        );

        let long = format!("{}{}", "a".repeat(BODY_HEAD), "TAIL".repeat(10_000));
        let out = answered((axum::http::StatusCode::BAD_GATEWAY, long)).await;
        let Outcome::Retry { error, after: None } = out else {
            panic!("{out:?}")
        };
        let head = error
            .strip_prefix("webhook answered 502 Bad Gateway: ")
            .unwrap();
        assert_eq!(head, "a".repeat(BODY_HEAD));
    }

    #[tokio::test]
    async fn a_4xx_fails_for_good_except_the_ones_about_timing() {
        use axum::http::StatusCode as S;
        for status in [
            S::BAD_REQUEST,
            S::UNAUTHORIZED,
            S::FORBIDDEN,
            S::NOT_FOUND,
            S::GONE,
            S::PAYLOAD_TOO_LARGE,
            S::UNPROCESSABLE_ENTITY,
        ] {
            let out = answered((status, "no such recipient")).await;
            assert_eq!(
                out,
                Outcome::fail(format!("webhook answered {status}: no such recipient")),
                "{status}"
            );
        }
        for status in [
            S::REQUEST_TIMEOUT,
            S::LOCKED,
            S::TOO_EARLY,
            S::TOO_MANY_REQUESTS,
        ] {
            let out = answered(status).await;
            assert_eq!(
                out,
                Outcome::retry(format!("webhook answered {status}")),
                "{status}"
            );
        }
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed_and_retries() {
        let target = serve(|| async { axum::http::StatusCode::OK.into_response() }).await;
        let url = target.url.clone();
        let out = answered((axum::http::StatusCode::FOUND, [("location", url)])).await;
        assert_eq!(out, Outcome::retry("webhook answered 302 Found"));
        assert!(target.received().is_empty());
    }

    #[tokio::test]
    async fn a_closed_port_retries_with_connection_failed() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let out = deliver(&handler(&format!("http://{addr}/hook?token=sekrit"))).await;
        let Outcome::Retry { error, after: None } = out else {
            panic!("{out:?}")
        };
        assert!(error.starts_with("webhook connection failed: "), "{error}");
        assert!(error.contains("onnection refused"), "{error}");
        assert!(
            !error.contains("sekrit"),
            "the URL stays out of the error: {error}"
        );
    }

    #[tokio::test]
    async fn a_server_slower_than_the_timeout_retries_with_timed_out() {
        let server = serve(|| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            axum::http::StatusCode::OK.into_response()
        })
        .await;
        let h = WebhookHandler::new(
            "send_email",
            &WebhookConfig {
                timeout: Duration::from_millis(300),
                ..config(&server.url)
            },
        )
        .unwrap();
        let started = Instant::now();
        let out = deliver(&h).await;
        assert_eq!(out, Outcome::retry("webhook timed out after 300ms"));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(server.received().len(), 1, "the request was sent");
    }

    #[tokio::test]
    async fn cancellation_abandons_the_request_at_once() {
        let server = serve(|| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            axum::http::StatusCode::OK.into_response()
        })
        .await;
        let h = handler(&server.url);
        let started = Instant::now();
        let cancelled = tokio::time::sleep(Duration::from_millis(300));
        let out = h.deliver(PAYLOAD, &meta(), cancelled).await;
        assert_eq!(out, Outcome::Snooze(Duration::ZERO));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_payload_that_is_not_json_fails_without_a_request() {
        let server = serve(|| async { axum::http::StatusCode::OK.into_response() }).await;
        let out = handler(&server.url)
            .deliver("{not json", &meta(), std::future::pending())
            .await;
        assert!(
            matches!(&out, Outcome::Fail(e) if e.starts_with("the payload is not JSON")),
            "{out:?}"
        );
        assert!(server.received().is_empty());
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_dot_body() {
        // Computed independently: printf '1718900000.{"a":1}' | openssl dgst -sha256 -hmac key
        assert_eq!(
            signature(b"key", 1_718_900_000, br#"{"a":1}"#),
            "v1=40ab139a45a1acc12032f36f23954cd1750dbf44112ab62b264f14dfb2c89dea"
        );
    }
}
