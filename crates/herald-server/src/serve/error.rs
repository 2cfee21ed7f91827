//! The API's errors, always `{"error": {"code": "...", "message": "..."}}`,
//! and the extractors that turn every malformed request into one.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use herald::escape::escaped;
use herald::ClientError;
use serde::de::DeserializeOwned;

/// An API error: an HTTP status, a stable snake_case code, and a message
/// that says what was wrong and how to fix it.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The machine-readable code.
    pub code: &'static str,
    /// For people: what was wrong, and how to fix it.
    pub message: String,
    /// A `WWW-Authenticate` header to send (401 only).
    pub challenge: Option<&'static str>,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            challenge: None,
        }
    }

    /// 400.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 422: well-formed, but a value is refused.
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 404 for an event id.
    pub fn no_event(id: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "event_not_found",
            format!("no event {id}: it was never emitted, or it finished (done events are deleted unless done_retention is set), or it was deleted"),
        )
    }

    /// Prefixes the message (`events[3]: …`).
    pub fn within(mut self, prefix: &str) -> Self {
        self.message = format!("{prefix}: {}", self.message);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": { "code": self.code, "message": self.message }
        });
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(challenge) = self.challenge {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        response
    }
}

impl From<ClientError> for ApiError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::InBatch { index, error } => {
                ApiError::from(*error).within(&format!("events[{index}]"))
            }
            ClientError::TooLarge { .. } => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!(
                    "{e}; send a smaller payload (the limit is the server's max_payload_bytes)"
                ),
            ),
            ClientError::InvalidName { .. } => ApiError::invalid(
                "invalid_name",
                format!("{e}; names are 1 to 200 bytes of UTF-8 without control characters"),
            ),
            ClientError::NoAttempts => ApiError::invalid(
                "invalid_max_attempts",
                "max_attempts must be at least 1; leave it out for the default (10)",
            ),
            ClientError::RunAtAndDelay => ApiError::invalid(
                "invalid_run_at",
                "give run_at (an RFC 3339 time) or delay (a duration), not both",
            ),
            ClientError::NotJson(m) => {
                ApiError::bad_request("malformed_json", format!("payload is not valid JSON: {m}"))
            }
            ClientError::NoSubscribers { .. } => ApiError::invalid(
                "no_subscribers",
                format!("{e}: an event nobody runs would be lost; subscribe a handler first (PUT /v1/topics/{{topic}}/subscribers/{{handler}})"),
            ),
            ClientError::Store(s) => ApiError::from(s),
        }
    }
}

impl From<herald::StoreError> for ApiError {
    fn from(e: herald::StoreError) -> Self {
        use herald::StoreError as S;
        match e {
            S::Invalid(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
            S::Closed => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the server is shutting down; send the request to another instance or try again shortly",
            ),
            S::Unavailable { .. } => {
                tracing::warn!(error = %escaped(&e), "store unavailable while serving a request");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    format!("{e}; the database did not answer within the store's retries, try again (an emit may be repeated as is)"),
                )
            }
            other => {
                tracing::warn!(error = %escaped(&other), "store error while serving a request");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    format!("{other}; nothing was changed, try again"),
                )
            }
        }
    }
}

/// A JSON body, read with the request size limit, with errors that name the
/// offending field by its path (`events[2].delay`).
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|m| {
                let m = m.trim().to_ascii_lowercase();
                m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
            })
            .unwrap_or(false);
        if !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be JSON: send the header Content-Type: application/json",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request_too_large",
                    "the request body is over the server's max_request_bytes; send fewer events per batch or smaller payloads",
                )
            } else {
                ApiError::bad_request("unreadable_body", format!("cannot read the request body: {}", e.body_text()))
            }
        })?;
        // Every body of this API is an object (serde would also take an array).
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        if first.is_some_and(|b| *b == b'[') {
            return Err(ApiError::invalid(
                "invalid_field",
                "the body is a JSON array; send a JSON object (see GET /openapi.json)",
            ));
        }
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| json_error(e.path().to_string(), e.into_inner()))?;
        de.end().map_err(|e| json_error(".".to_string(), e))?;
        Ok(JsonBody(value))
    }
}

fn json_error(path: String, e: serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::bad_request(
            "malformed_json",
            format!("the body is not valid JSON: {e}; check quoting and commas"),
        ),
        Category::Data => {
            // serde_json appends " at line L column C": keep it, it helps.
            let where_ = if path == "." {
                String::new()
            } else {
                format!("{path}: ")
            };
            ApiError::invalid("invalid_field", format!("{where_}{e}"))
        }
    }
}

/// A query string, with unknown parameters refused. Declare every field
/// as a string and check values in the handler, so that each message
/// names the parameter.
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        if let Some(bad) = malformed_escape(query) {
            return Err(ApiError::bad_request(
                "invalid_query",
                format!("query string: {}", bad.message()),
            ));
        }
        serde_urlencoded::from_str(query)
            .map(QueryParams)
            .map_err(|e| ApiError::bad_request("invalid_query", format!("query string: {e}")))
    }
}

/// Path parameters, with a JSON error when they can't be read.
pub struct PathParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // axum decodes leniently (`%ZZ` stays `%ZZ`, so that `%ZZ` and
        // `%25ZZ` would name the same tenant): refuse what is not an escape.
        if let Some(bad) = malformed_escape(parts.uri.path()) {
            return Err(ApiError::bad_request(
                "invalid_path",
                format!("path: {}", bad.message()),
            ));
        }
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(t)| PathParams(t))
            .map_err(|e| {
                ApiError::bad_request(
                    "invalid_path",
                    format!("{}; percent-encode names in paths as UTF-8", e.body_text()),
                )
            })
    }
}

/// A `%` in a raw path or query string that does not start an escape.
#[derive(Debug, PartialEq, Eq)]
pub struct MalformedEscape<'a> {
    /// Its byte offset.
    pub at: usize,
    /// The `%` and what follows it, at most two more characters.
    pub text: &'a str,
}

impl MalformedEscape<'_> {
    fn message(&self) -> String {
        format!(
            "{:?} at byte {} is not a percent-escape (% and two hex digits); write a literal % as %25",
            self.text, self.at
        )
    }
}

/// The first `%` of `raw` not followed by two hex digits: one pass over the
/// bytes. (Whether the escapes decode to UTF-8 is checked when decoding.)
pub fn malformed_escape(raw: &str) -> Option<MalformedEscape<'_>> {
    let bytes = raw.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            i += 1;
            continue;
        }
        match bytes.get(i + 1..i + 3) {
            Some([a, b]) if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => i += 3,
            _ => {
                // Up to two characters after the `%`, whole (the raw text
                // is ASCII in practice, but a `&str` may hold more).
                let end = raw[i + 1..]
                    .char_indices()
                    .nth(2)
                    .map_or(raw.len(), |(n, _)| i + 1 + n);
                return Some(MalformedEscape {
                    at: i,
                    text: &raw[i..end],
                });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_store_is_a_503() {
        let e = ApiError::from(herald::StoreError::Unavailable {
            op: "emit",
            source: "connection reset".into(),
        });
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.code, "store_unavailable");
        assert!(e.message.contains("connection reset"), "{}", e.message);
    }
}
