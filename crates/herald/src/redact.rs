//! URLs as messages and logs show them: with the secret in their user
//! information hidden. One reading of where that information is, for every
//! store and queue URL herald prints.

use std::ops::Range;

/// The byte range of a URL's user information (before the `@` of its
/// authority), if it has one. The authority ends at the first `/`, `?` or
/// `#` after the scheme; the last `@` in it ends the user information (a
/// password may hold an unescaped `@`, a host never does).
pub fn userinfo(url: &str) -> Option<Range<usize>> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let at = url[start..end].rfind('@')?;
    Some(start..start + at)
}

/// `url` with its password hidden: `scheme://user:***@host…`. A user name
/// alone is kept (PostgreSQL's `postgres://app@db/app` names no secret).
pub fn redact_password(url: &str) -> String {
    redact(url, false)
}

/// `url` with its credentials hidden: `scheme://user:***@host…`, and a
/// user information without a `:` hidden whole, `scheme://***@host…`
/// (NATS takes a token there).
pub fn redact_credentials(url: &str) -> String {
    redact(url, true)
}

fn redact(url: &str, lone_is_secret: bool) -> String {
    let Some(r) = userinfo(url) else {
        return url.to_string();
    };
    let hidden = match url[r.clone()].split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None if lone_is_secret => "***".to_string(),
        None => return url.to_string(),
    };
    format!("{}{hidden}{}", &url[..r.start], &url[r.end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_and_user_names_kept() {
        for (url, want) in [
            (
                "postgres://u:secret@h:5432/db?sslmode=require",
                "postgres://u:***@h:5432/db?sslmode=require",
            ),
            (
                "postgres://postgres@127.0.0.1:5432/test",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
            // A password holding '@' and ':'; the path holding '@'.
            ("postgres://u:p@ss:w@h/db@x", "postgres://u:***@h/db@x"),
            ("not a url", "not a url"),
            ("postgres://h/db?user=a@b", "postgres://h/db?user=a@b"),
        ] {
            assert_eq!(redact_password(url), want, "{url}");
        }
    }

    #[test]
    fn credentials_hide_a_lone_token_too() {
        assert_eq!(
            redact_credentials("nats://herald:secret@nats-1:4222"),
            "nats://herald:***@nats-1:4222"
        );
        assert_eq!(
            redact_credentials("tls://s3cret@nats-1:4222"),
            "tls://***@nats-1:4222"
        );
        assert_eq!(
            redact_credentials("nats://nats-1:4222"),
            "nats://nats-1:4222"
        );
    }
}
