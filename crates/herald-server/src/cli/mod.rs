//! The operator's CLI: `herald emit`, `herald events …`, `herald pause` and
//! the other rule verbs, `herald limits …`, `herald schedules …`, and
//! `herald stats`. Each talks to a running
//! `herald serve` over its JSON API (`/v1`), prints a readable table, or
//! with `--json` the server's JSON, and exits with a status scripts can
//! trust (see [`exit`]).

pub mod emit;
pub mod events;
pub mod limits;
pub mod rules;
pub mod schedules;
pub mod stats;
pub mod topics;

use std::io::Write;
use std::time::Duration;

use reqwest::{Method, StatusCode, Url};
use serde_json::Value;

/// The exit statuses of the CLI commands.
pub mod exit {
    /// Anything else: an unexpected answer, stdin unreadable, ….
    pub const OTHER: u8 = 1;
    /// A usage error or bad input: clap's own errors, a payload that is not
    /// JSON, and the server's 400, 413, 415 and 422.
    pub const USAGE: u8 = 2;
    /// 404: no such event (or route).
    pub const NOT_FOUND: u8 = 3;
    /// 409: the event is not dead (retry) or is running (rm), or another conflict.
    pub const CONFLICT: u8 = 4;
    /// 401 or 403: a missing, unknown or insufficient token.
    pub const AUTH: u8 = 5;
    /// The server could not be reached, timed out, or answered 5xx.
    pub const UNAVAILABLE: u8 = 6;
}

/// The exit-status table shown by `herald --help`.
pub const EXIT_HELP: &str = "\
Exit status of emit, events, pause, unpause, block, unblock, limits, schedules, stats and topics:
  0  success
  1  other error (unexpected answer, unreadable stdin)
  2  usage error or bad input (bad arguments, payload not JSON, a topic without
     subscribers; HTTP 400, 413, 415, 422)
  3  not found (HTTP 404)
  4  conflict: event not dead (retry), running (rm) (HTTP 409)
  5  auth: missing, unknown or insufficient token (HTTP 401, 403)
  6  server unreachable, timed out, or failing (HTTP 5xx)
On an error the server's message and the HTTP status go to stderr.";

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Where the server is and how to talk to it: shared by every CLI command.
#[derive(clap::Args, Clone, Debug)]
pub struct Remote {
    /// The server's base URL.
    #[arg(
        long,
        env = "HERALD_URL",
        default_value = "http://127.0.0.1:7878",
        value_name = "URL"
    )]
    pub url: String,
    /// API token, sent as `Authorization: Bearer TOKEN`.
    #[arg(
        long,
        env = "HERALD_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// Print the server's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A failed command: its exit status and what to print on stderr.
#[derive(Debug)]
pub struct Failure {
    /// The exit status, one of [`exit`].
    pub code: u8,
    /// The message (printed after `herald: `).
    pub message: String,
}

impl Failure {
    /// A failure with this status and message.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

/// A successful answer: its body as text and as JSON.
pub struct Reply {
    /// The body exactly as the server sent it.
    pub text: String,
    /// The body parsed (`null` if it is not JSON).
    pub value: Value,
}

/// A client of one server.
pub struct Api {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

impl Api {
    /// A client for `remote`; an unusable URL is a usage error.
    pub fn new(remote: &Remote) -> Result<Self, Failure> {
        let base = Url::parse(&remote.url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .ok_or_else(|| {
                Failure::new(
                    exit::USAGE,
                    format!(
                        "--url {:?} is not an http:// or https:// URL (e.g. http://127.0.0.1:7878)",
                        remote.url
                    ),
                )
            })?;
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| Failure::new(exit::OTHER, format!("cannot build an HTTP client: {e}")))?;
        Ok(Api {
            http,
            base,
            token: remote.token.clone().filter(|t| !t.is_empty()),
        })
    }

    /// The URL of these path segments (each percent-encoded) under the base.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// Sends a request; a JSON `body` is sent as is. Any answer but 2xx
    /// becomes a [`Failure`] carrying the server's message and status.
    pub async fn call(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, String)],
        body: Option<String>,
    ) -> Result<Reply, Failure> {
        let url = self.url(segments);
        let mut request = self.http.request(method.clone(), url.clone());
        if !query.is_empty() {
            request = request.query(query);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let response = request.send().await.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| self.unreachable(&e))?;
        let value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(Reply { text, value });
        }
        Err(http_failure(&method, url.path(), status, &text, &value))
    }

    fn unreachable(&self, e: &reqwest::Error) -> Failure {
        let mut cause = String::new();
        let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
        while let Some(s) = source {
            cause = s.to_string();
            source = s.source();
        }
        if cause.is_empty() {
            cause = e.to_string();
        }
        let base = self.base.as_str().trim_end_matches('/');
        let message = if e.is_connect() {
            format!(
                "cannot connect to {base}: {cause}; is the server running? Start one with \
                 `herald serve`, or point --url (or HERALD_URL) at it"
            )
        } else if e.is_timeout() {
            format!(
                "{base} did not answer within {}s; the server may be overloaded, try again",
                TIMEOUT.as_secs()
            )
        } else {
            format!("request to {base} failed: {cause}")
        };
        Failure::new(exit::UNAVAILABLE, message)
    }
}

/// The exit status for an HTTP error status.
pub fn status_code(status: StatusCode) -> u8 {
    match status.as_u16() {
        400 | 413 | 415 | 422 => exit::USAGE,
        401 | 403 => exit::AUTH,
        404 => exit::NOT_FOUND,
        409 => exit::CONFLICT,
        500..=599 => exit::UNAVAILABLE,
        _ => exit::OTHER,
    }
}

fn http_failure(
    method: &Method,
    path: &str,
    status: StatusCode,
    text: &str,
    value: &Value,
) -> Failure {
    let error = &value["error"];
    let message = match (error["code"].as_str(), error["message"].as_str()) {
        (Some(code), Some(message)) => format!("{message} (HTTP {status}, {code})"),
        _ => {
            let body: String = text.trim().chars().take(500).collect();
            if body.is_empty() {
                format!("{method} {path}: HTTP {status}")
            } else {
                format!("{method} {path}: HTTP {status}: {body}")
            }
        }
    };
    Failure::new(status_code(status), message)
}

/// Writes to stdout; a closed pipe (`herald events ls | head`) is not an error.
pub fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    let _ = out.flush();
}

/// A cell: control characters (newlines in an error) shown as spaces,
/// cut to `max` characters with `…`.
pub fn cell(text: &str, max: usize) -> String {
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if clean.chars().count() <= max {
        clean
    } else {
        let mut cut: String = clean.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// A text table: the header, then the rows, columns padded to line up
/// (the last one is not padded).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, c) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        let mut line = String::new();
        for (i, c) in row.iter().enumerate() {
            line.push_str(c);
            if i < last {
                let pad = widths[i] - c.chars().count() + 2;
                line.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A JSON value as a short cell: strings without quotes, `null` as `-`.
pub fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The body of a reply, or a failure if it lacks what the command needs.
pub fn unexpected(what: &str, reply: &Reply) -> Failure {
    Failure::new(
        exit::OTHER,
        format!(
            "unexpected answer from the server (no {what}): {}",
            cell(&reply.text, 300)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_line_up() {
        let t = table(
            &["ID", "STATE", "NOTE"],
            &[
                vec!["1".into(), "pending".into(), "x".into()],
                vec!["22".into(), "é".into(), "".into()],
            ],
        );
        assert_eq!(t, "ID  STATE    NOTE\n1   pending  x\n22  é\n");
    }

    #[test]
    fn cells_are_cleaned_and_cut() {
        assert_eq!(cell("a\nb", 10), "a b");
        assert_eq!(cell("abcdef", 4), "abc…");
    }

    #[test]
    fn statuses_map_to_exit_codes() {
        assert_eq!(status_code(StatusCode::NOT_FOUND), exit::NOT_FOUND);
        assert_eq!(status_code(StatusCode::CONFLICT), exit::CONFLICT);
        assert_eq!(status_code(StatusCode::UNAUTHORIZED), exit::AUTH);
        assert_eq!(status_code(StatusCode::FORBIDDEN), exit::AUTH);
        assert_eq!(status_code(StatusCode::UNPROCESSABLE_ENTITY), exit::USAGE);
        assert_eq!(
            status_code(StatusCode::SERVICE_UNAVAILABLE),
            exit::UNAVAILABLE
        );
        assert_eq!(status_code(StatusCode::METHOD_NOT_ALLOWED), exit::OTHER);
    }

    #[test]
    fn names_are_percent_encoded_in_paths() {
        let api = Api::new(&Remote {
            url: "http://h:1/base/".into(),
            token: None,
            json: false,
        })
        .unwrap();
        assert_eq!(
            api.url(&["v1", "tenants", "a/b c", "handlers", "h"])
                .as_str(),
            "http://h:1/base/v1/tenants/a%2Fb%20c/handlers/h"
        );
    }
}
