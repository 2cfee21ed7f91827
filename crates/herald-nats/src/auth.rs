//! The credentials in a NATS URL: split off the URL (the client takes them
//! apart) and decoded, and the message when the server refuses them.

use herald::redact::userinfo;

/// Decodes `%XX` escapes (user information in URLs is percent-encoded).
pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Credentials written in a URL.
pub(crate) enum UrlAuth {
    None,
    UserPassword(String, String),
    Token(String),
}

/// Splits the credentials off a URL: async-nats 0.42 does not send the ones
/// written in the URL, and the URL it is given must not hold a secret,
/// because its debug logs print it.
pub(crate) fn split_auth(url: &str) -> (String, UrlAuth) {
    let Some(r) = userinfo(url) else {
        return (url.to_string(), UrlAuth::None);
    };
    // As the NATS clients read it: `user:password`, or a lone token.
    let auth = match url[r.clone()].split_once(':') {
        Some((user, pass)) => UrlAuth::UserPassword(percent_decode(user), percent_decode(pass)),
        None => UrlAuth::Token(percent_decode(&url[r.clone()])),
    };
    (format!("{}{}", &url[..r.start], &url[r.end + 1..]), auth)
}

/// What to say when the server refuses the connection's credentials.
pub(crate) fn refused(auth: &UrlAuth, credentials: Option<&std::path::Path>) -> String {
    match (auth, credentials) {
        (_, Some(path)) => format!(
            "the server refused the credentials file {}",
            path.display()
        ),
        (UrlAuth::UserPassword(user, _), None) => format!(
            "the server refused user {user:?} with the password in the URL"
        ),
        (UrlAuth::Token(_), None) => "the server refused the token in the URL".to_string(),
        (UrlAuth::None, None) => "the server wants credentials: write user:password@ or token@ in the URL, or give a credentials file".to_string(),
    }
}
