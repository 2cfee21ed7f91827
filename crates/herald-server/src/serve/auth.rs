//! Bearer tokens: who is calling. Tokens are configured by their SHA-256;
//! a presented token is hashed and compared with every configured digest in
//! constant time.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts, StatusCode};
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use super::api::AppState;
use super::error::ApiError;
use crate::config::AuthConfig;

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The operator token, or anyone when no token is configured (loopback only).
    Operator,
    /// A tenant token: this tenant only.
    Tenant(String),
}

impl Caller {
    /// Refuses a tenant token for another tenant.
    pub fn may_act_for(&self, tenant: &str) -> Result<(), ApiError> {
        match self {
            Caller::Operator => Ok(()),
            Caller::Tenant(own) if own == tenant => Ok(()),
            Caller::Tenant(own) => Err(ApiError::forbidden(format!(
                "this token is tenant {own:?}'s and cannot act for tenant {tenant:?}; use that tenant's token or the operator token"
            ))),
        }
    }

    /// Refuses anyone but the operator.
    pub fn must_be_operator(&self, what: &str) -> Result<(), ApiError> {
        match self {
            Caller::Operator => Ok(()),
            Caller::Tenant(_) => Err(ApiError::forbidden(format!(
                "only the operator token may {what}; a tenant can pause and unpause its own handlers instead"
            ))),
        }
    }

    /// Refuses anyone but the operator, saying what a tenant can do instead.
    pub fn must_be_operator_or(&self, what: &str, instead: &str) -> Result<(), ApiError> {
        match self {
            Caller::Operator => Ok(()),
            Caller::Tenant(_) => Err(ApiError::forbidden(format!(
                "only the operator token may {what}; {instead}"
            ))),
        }
    }

    /// The tenant a tenant token is limited to; `None` for the operator.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Caller::Operator => None,
            Caller::Tenant(t) => Some(t),
        }
    }
}

/// The configured digests, ready for lookups.
#[derive(Debug)]
pub struct Tokens {
    open: bool,
    /// Index 0 is the operator (all zeros and unmatched when not configured).
    digests: Vec<[u8; 32]>,
    /// Who each digest is; `None` for the operator.
    owners: Vec<Option<String>>,
}

impl Tokens {
    /// From the configuration.
    pub fn new(config: &AuthConfig) -> Self {
        let mut digests = Vec::with_capacity(config.tenants.len() + 1);
        let mut owners = Vec::with_capacity(config.tenants.len() + 1);
        if let Some(d) = config.operator {
            digests.push(d);
            owners.push(None);
        }
        for (tenant, d) in &config.tenants {
            digests.push(*d);
            owners.push(Some(tenant.clone()));
        }
        Tokens {
            open: config.is_open(),
            digests,
            owners,
        }
    }

    /// True when no token is configured: every caller is the operator.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Finds whose token this is. Every configured digest is compared,
    /// without stopping at a match, in constant time per digest.
    pub fn identify(&self, token: &str) -> Option<Caller> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = subtle::Choice::from(0);
        let mut index = 0u32;
        for (i, d) in self.digests.iter().enumerate() {
            let hit = presented.ct_eq(d);
            index = u32::conditional_select(&index, &(i as u32), hit);
            found |= hit;
        }
        if bool::from(found) {
            Some(match &self.owners[index as usize] {
                None => Caller::Operator,
                Some(t) => Caller::Tenant(t.clone()),
            })
        } else {
            None
        }
    }
}

fn unauthorized(code: &'static str, message: &str, challenge: &'static str) -> ApiError {
    let mut e = ApiError::new(StatusCode::UNAUTHORIZED, code, message);
    e.challenge = Some(challenge);
    e
}

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let tokens = &state.tokens;
        if tokens.is_open() {
            return Ok(Caller::Operator);
        }
        let Some(value) = parts.headers.get(header::AUTHORIZATION) else {
            return Err(unauthorized(
                "missing_token",
                "this request needs a token: send the header Authorization: Bearer <token>",
                "Bearer",
            ));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim())
            .filter(|t| !t.is_empty());
        let Some(token) = token else {
            return Err(unauthorized(
                "invalid_token",
                "the Authorization header must be `Bearer <token>`",
                "Bearer error=\"invalid_request\"",
            ));
        };
        tokens.identify(token).ok_or_else(|| {
            unauthorized(
                "invalid_token",
                "the bearer token matches no configured token; check the token, or the SHA-256 digests in the server's [auth] configuration",
                "Bearer error=\"invalid_token\"",
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(token: &str) -> [u8; 32] {
        Sha256::digest(token.as_bytes()).into()
    }

    #[test]
    fn tokens_are_found_by_their_digest() {
        let t = Tokens::new(&AuthConfig {
            operator: Some(digest("op")),
            tenants: vec![("acme".into(), digest("a")), ("beta".into(), digest("b"))],
        });
        assert_eq!(t.identify("op"), Some(Caller::Operator));
        assert_eq!(t.identify("a"), Some(Caller::Tenant("acme".into())));
        assert_eq!(t.identify("b"), Some(Caller::Tenant("beta".into())));
        assert_eq!(t.identify("c"), None);
        assert_eq!(t.identify(""), None);
        assert!(!t.is_open());
    }

    #[test]
    fn without_an_operator_token_tenants_still_work() {
        let t = Tokens::new(&AuthConfig {
            operator: None,
            tenants: vec![("acme".into(), digest("a"))],
        });
        assert_eq!(t.identify("a"), Some(Caller::Tenant("acme".into())));
        // An all-zero digest is never configured by accident.
        assert_eq!(t.identify("op"), None);
    }
}
