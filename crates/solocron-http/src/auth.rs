//! Bearer tokens with roles, compared in constant time.
//!
//! With no token configured (allowed on a loopback address only), anyone who can reach the
//! server may read, and nobody may act: every action needs a token of the `operate` role.
//! With tokens, every request to the API and to `/metrics` needs one.

use std::fmt;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use crate::problem::Problem;
use crate::AppState;

/// Shortest token secret accepted: guessing one must be hopeless.
pub const TOKEN_SECRET_BYTES_MIN: usize = 16;
/// Longest token secret accepted (and longest `Authorization` value read).
pub const TOKEN_SECRET_BYTES_MAX: usize = 512;

/// What a token allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read everything.
    Read,
    /// Read, and act: trigger, pause, resume, unlock.
    Operate,
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "read" => Ok(Role::Read),
            "operate" => Ok(Role::Operate),
            other => Err(format!("unknown role `{other}`; expected read or operate")),
        }
    }
}

/// One API token: a name (recorded as who acted), a role, and its secret (never shown).
#[derive(Clone)]
pub struct Token {
    name: String,
    role: Role,
    digest: [u8; 32],
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token").field("name", &self.name).field("role", &self.role).finish_non_exhaustive()
    }
}

/// Why a token could not be made.
#[derive(Debug, Clone, thiserror::Error)]
#[error("token `{name}`: {message}")]
pub struct TokenError {
    /// The token's name.
    pub name: String,
    /// What is wrong (never the secret itself).
    pub message: String,
}

impl Token {
    /// A token; its secret is kept only as a digest.
    pub fn new(name: &str, role: Role, secret: &str) -> Result<Token, TokenError> {
        let err = |message: String| TokenError { name: name.to_owned(), message };
        if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
        {
            return Err(err("the name must be 1 to 64 characters of A-Z a-z 0-9 - _ . @".into()));
        }
        let secret = secret.trim();
        if secret.len() < TOKEN_SECRET_BYTES_MIN || secret.len() > TOKEN_SECRET_BYTES_MAX {
            return Err(err(format!(
                "the secret must be {TOKEN_SECRET_BYTES_MIN} to {TOKEN_SECRET_BYTES_MAX} bytes, it is {}",
                secret.len()
            )));
        }
        Ok(Token { name: name.to_owned(), role, digest: Sha256::digest(secret.as_bytes()).into() })
    }

    /// The token's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The token's role.
    pub fn role(&self) -> Role {
        self.role
    }
}

/// Finds the token whose secret is `given`, comparing digests in constant time and looking
/// at every token whatever matched, so timing tells nothing of which one did.
fn find<'a>(tokens: &'a [Token], given: &str) -> Option<&'a Token> {
    let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
    let mut found = None;
    for t in tokens {
        if bool::from(t.digest.ct_eq(&digest)) {
            found = Some(t);
        }
    }
    found
}

/// Who is calling, as their token says.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's name, or `anonymous` without tokens.
    pub name: String,
    /// What they may do; `None`: only read (no tokens are configured).
    pub role: Option<Role>,
}

impl Caller {
    /// The caller's name, if they may act; otherwise the problem to answer.
    pub fn operator(&self) -> Result<&str, Problem> {
        match self.role {
            Some(Role::Operate) => Ok(&self.name),
            Some(Role::Read) => Err(Problem::new(
                StatusCode::FORBIDDEN,
                format!("token `{}` may only read; actions need a token with role `operate`", self.name),
            )),
            None => Err(Problem::unauthorized(
                "actions need a token with role `operate`: configure [http] tokens and send `Authorization: Bearer <token>`",
            )),
        }
    }
}

/// The token a request's `Authorization: Bearer` header names, if it is one of `tokens`.
fn bearer<'a>(tokens: &'a [Token], authorization: &str) -> Option<&'a Token> {
    let secret = authorization.strip_prefix("Bearer ").filter(|s| s.len() <= TOKEN_SECRET_BYTES_MAX)?;
    find(tokens, secret.trim())
}

/// Whether the request carries one of the server's tokens, of any role. Never a refusal:
/// `/readyz` asks it before saying more than ready or not, and a probe sends no token.
pub(crate) fn holds_token(tokens: &[Token], headers: &HeaderMap) -> bool {
    let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    given.is_some_and(|v| bearer(tokens, v).is_some())
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, Problem> {
        let tokens = state.tokens();
        let given = parts.headers.get(header::AUTHORIZATION).map(|v| v.to_str().unwrap_or_default());
        match (tokens.is_empty(), given) {
            (true, None) => Ok(Caller { name: "anonymous".into(), role: None }),
            (true, Some(_)) => {
                Err(Problem::unauthorized("this server has no tokens configured; send no Authorization header"))
            }
            (false, None) => Err(Problem::unauthorized("send `Authorization: Bearer <token>`")),
            (false, Some(v)) => {
                let t = bearer(tokens, v).ok_or_else(|| Problem::unauthorized("unknown token"))?;
                Ok(Caller { name: t.name.clone(), role: Some(t.role) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_found_by_its_secret_only() {
        let tokens = vec![
            Token::new("ops", Role::Operate, "s3cret-operate-0123").unwrap(),
            Token::new("viewer", Role::Read, "s3cret-read-0123456").unwrap(),
        ];
        assert_eq!(find(&tokens, "s3cret-read-0123456").map(Token::name), Some("viewer"));
        assert_eq!(find(&tokens, "s3cret-operate-0123").map(Token::role), Some(Role::Operate));
        assert!(find(&tokens, "s3cret-read-012345").is_none());
        assert!(find(&tokens, "").is_none());
    }

    #[test]
    fn short_secrets_and_odd_names_are_refused_without_showing_the_secret() {
        let e = Token::new("ops", Role::Read, "short").unwrap_err();
        assert!(e.to_string().contains("16 to 512 bytes"), "{e}");
        assert!(!e.to_string().contains("short"), "{e}");
        assert!(Token::new("a b", Role::Read, "0123456789abcdef").is_err());
        let t = Token::new("ops", Role::Read, "0123456789abcdef").unwrap();
        assert!(!format!("{t:?}").contains("0123456789abcdef"));
    }
}
