//! API tokens: who may read, write or administer which spaces.
//!
//! A token is a random secret handed to a client; engram keeps only its BLAKE3 hash (`engram token new` prints
//! both). A request names its token as `Authorization: Bearer TOKEN`; the presented token is hashed and compared
//! with every configured hash in constant time. Each token has a scope (read ⊂ write ⊂ admin) over a list of spaces,
//! where `news` names one space, `desk-*` every space starting with `desk-`, and `*` every space.
//!
//! With no token configured the API is open, and engram serves it only on a loopback address (see
//! [`check_listen`]).

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

/// What a token may do. Each scope includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Queries, node and event reads, the space list, the summary backlog.
    Read,
    /// Read, and ingest (records, replacements, deletes).
    Write,
    /// Write, and the rejected inputs of `/v1/errors`.
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        }
    }
}

/// One token as configured: `[[auth.tokens]]` in the config file, or `[[tokens]]` in `auth.tokens-file`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct TokenConfig {
    /// Who holds it (logged with each refusal, never the token).
    pub name: String,
    /// The BLAKE3 hash of the token, 64 hex digits (`engram token new` or `engram token hash`).
    pub hash: String,
    pub scope: Scope,
    /// The spaces it reaches: a name, a prefix ending in `*`, or `*` for all.
    pub spaces: Vec<String>,
    /// The most spaces it may create (0: no limit beyond `ingest.max-spaces`).
    #[serde(default)]
    pub max_spaces: usize,
}

/// The `[auth]` section.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct AuthConfig {
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    /// A TOML file of `[[tokens]]` tables, read at start (a Kubernetes Secret mounted as a file); empty: none.
    pub tokens_file: String,
    /// Serve the API on a non-loopback address with no token configured: anyone who reaches the port can read,
    /// write and delete every space.
    pub allow_unauthenticated: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    tokens: Vec<TokenConfig>,
}

/// A configured token, ready to check.
#[derive(Clone, Debug)]
pub struct Token {
    pub name: String,
    hash: [u8; 32],
    pub scope: Scope,
    spaces: Vec<String>,
    pub max_spaces: usize,
}

impl Token {
    /// Whether `space` is one of this token's.
    pub fn reaches(&self, space: &str) -> bool {
        self.spaces.iter().any(|p| matches(p, space))
    }

    /// Whether the token reaches every space (and so the rows no space owns).
    pub fn reaches_all(&self) -> bool {
        self.spaces.iter().any(|p| p == "*")
    }
}

fn matches(pattern: &str, space: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => space.starts_with(prefix),
        None => pattern == space,
    }
}

/// Who is asking: a token, or anyone (no token is configured, and the API is on loopback).
#[derive(Clone, Debug)]
pub enum Grant {
    Open,
    Token(std::sync::Arc<Token>),
}

/// Why a grant does not allow something.
#[derive(Debug, thiserror::Error)]
#[error("token `{name}` ({scope}) may not {action} space `{space}`")]
pub struct Forbidden {
    pub name: String,
    pub scope: &'static str,
    pub action: &'static str,
    pub space: String,
}

impl Grant {
    /// Whether the grant may act on `space` with `need`.
    pub fn allows(&self, need: Scope, space: &str) -> bool {
        match self {
            Grant::Open => true,
            Grant::Token(t) => t.scope >= need && t.reaches(space),
        }
    }

    /// `Ok` when the grant may act on `space` with `need`, else why not.
    pub fn require(&self, need: Scope, space: &str) -> Result<(), Forbidden> {
        if self.allows(need, space) {
            return Ok(());
        }
        let Grant::Token(t) = self else { unreachable!("an open grant allows everything") };
        let action = match need {
            Scope::Read => "read",
            Scope::Write => "write to",
            Scope::Admin => "administer",
        };
        Err(Forbidden { name: t.name.clone(), scope: t.scope.as_str(), action, space: space.to_string() })
    }

    /// Whether the grant has at least `need` on some space (the routes that name no space).
    pub fn has(&self, need: Scope) -> bool {
        match self {
            Grant::Open => true,
            Grant::Token(t) => t.scope >= need,
        }
    }

    /// Whether rows that belong to no space (a record whose space could not be read) are the grant's to see.
    pub fn sees_unowned(&self) -> bool {
        match self {
            Grant::Open => true,
            Grant::Token(t) => t.reaches_all(),
        }
    }

    /// The token, when it has a space quota of its own (`max-spaces`).
    pub fn quota(&self) -> Option<&Token> {
        match self {
            Grant::Token(t) if t.max_spaces > 0 => Some(t),
            _ => None,
        }
    }
}

/// Why a request is not authenticated.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    #[error("this API needs a token: send `Authorization: Bearer TOKEN`")]
    Missing,
    #[error("the Authorization header is not `Bearer TOKEN`")]
    Malformed,
    #[error("the token is not known")]
    Unknown,
}

/// The configured tokens.
#[derive(Clone, Debug, Default)]
pub struct Access {
    tokens: Vec<std::sync::Arc<Token>>,
}

impl Access {
    /// The tokens of the config and of its tokens file; every problem is reported, naming the token.
    pub fn load(config: &AuthConfig) -> Result<Access, Vec<String>> {
        let mut configured = config.tokens.clone();
        let mut errors = Vec::new();
        if !config.tokens_file.is_empty() {
            match read_tokens_file(Path::new(&config.tokens_file)) {
                Ok(more) => configured.extend(more),
                Err(e) => errors.push(e),
            }
        }
        let mut tokens = Vec::new();
        let mut names = std::collections::HashSet::new();
        let mut hashes = std::collections::HashSet::new();
        for t in configured {
            let what = format!("auth token `{}`", t.name);
            if t.name.is_empty() || t.name.len() > 128 {
                errors.push(format!("{what}: `name` must have 1 to 128 bytes"));
            }
            if !names.insert(t.name.clone()) {
                errors.push(format!("{what}: two tokens have this name"));
            }
            let hash = match parse_hash(&t.hash) {
                Some(h) => h,
                None => {
                    errors.push(format!(
                        "{what}: `hash` must be the token's BLAKE3 hash, 64 hex digits (`engram token hash`), not the token"
                    ));
                    continue;
                }
            };
            if !hashes.insert(hash) {
                errors.push(format!("{what}: another token has the same hash"));
            }
            if t.spaces.is_empty() {
                errors.push(format!("{what}: `spaces` is empty (name spaces, prefixes like `desk-*`, or `*`)"));
            }
            for p in &t.spaces {
                let body = p.strip_suffix('*').unwrap_or(p);
                let ok = body.len() <= 128 && body.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
                if !ok || p.is_empty() {
                    errors.push(format!(
                        "{what}: space pattern `{p}` is not a space name, a prefix ending in `*`, or `*`"
                    ));
                }
            }
            tokens.push(std::sync::Arc::new(Token {
                name: t.name,
                hash,
                scope: t.scope,
                spaces: t.spaces,
                max_spaces: t.max_spaces,
            }));
        }
        if errors.is_empty() {
            Ok(Access { tokens })
        } else {
            Err(errors)
        }
    }

    /// Whether any token is configured (else the API is open).
    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Who the `Authorization` header value (if any) names.
    pub fn authenticate(&self, header: Option<&[u8]>) -> Result<Grant, Unauthenticated> {
        if !self.enabled() {
            return Ok(Grant::Open);
        }
        let value = header.ok_or(Unauthenticated::Missing)?;
        let token = bearer(value).ok_or(Unauthenticated::Malformed)?;
        let presented = *blake3::hash(token).as_bytes();
        // Every hash is compared, each in constant time: neither which token matched nor how much of it did shows
        // in the time taken.
        let mut found = None;
        for t in &self.tokens {
            if bool::from(t.hash.ct_eq(&presented)) {
                found = Some(t.clone());
            }
        }
        found.map(Grant::Token).ok_or(Unauthenticated::Unknown)
    }
}

/// `Bearer TOKEN` → TOKEN (the scheme case-insensitive, as RFC 7235 has it).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn read_tokens_file(path: &Path) -> Result<Vec<TokenConfig>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("auth.tokens-file = {}: cannot read it: {e}", path.display()))?;
    use figment::providers::{Format, Toml};
    let file: TokensFile = figment::Figment::from(Toml::string(&text))
        .extract()
        .map_err(|e| format!("auth.tokens-file = {}: {e}", path.display()))?;
    Ok(file.tokens)
}

/// The hex BLAKE3 hash of a token: what the config keeps.
pub fn hash_token(token: &str) -> String {
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

/// A new random token: `eng_` and 43 URL-safe characters (256 bits from the operating system's generator).
pub fn new_token() -> String {
    use rand::RngCore;
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bytes = [0u8; 43];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let body: String = bytes.iter().map(|b| ALPHABET[(*b & 63) as usize] as char).collect();
    format!("eng_{body}")
}

/// The API may listen on `listen` under this access: with no token only on a loopback address, unless
/// `auth.allow-unauthenticated` says otherwise.
pub fn check_listen(listen: SocketAddr, access: &Access, config: &AuthConfig) -> Result<(), String> {
    if access.enabled() || listen.ip().is_loopback() || config.allow_unauthenticated {
        return Ok(());
    }
    Err(format!(
        "listen = {listen} is not a loopback address and no API token is configured, so anyone who can reach the \
         port could read, write and delete every space. Configure tokens ([[auth.tokens]] or auth.tokens-file; \
         `engram token new` makes one; README, \"Access\"), listen on 127.0.0.1, or set \
         auth.allow-unauthenticated = true"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(tokens: &[(&str, &str, Scope, &[&str])]) -> Access {
        let config = AuthConfig {
            tokens: tokens
                .iter()
                .map(|(name, token, scope, spaces)| TokenConfig {
                    name: name.to_string(),
                    hash: hash_token(token),
                    scope: *scope,
                    spaces: spaces.iter().map(|s| s.to_string()).collect(),
                    max_spaces: 0,
                })
                .collect(),
            ..Default::default()
        };
        Access::load(&config).unwrap()
    }

    #[test]
    fn a_token_reaches_its_spaces_with_its_scope() {
        let a = access(&[("desk", "s3cret", Scope::Write, &["news", "wire-*"]), ("ops", "root", Scope::Admin, &["*"])]);
        let g = a.authenticate(Some(b"Bearer s3cret")).unwrap();
        assert!(g.allows(Scope::Write, "news") && g.allows(Scope::Read, "wire-eu"));
        assert!(!g.allows(Scope::Read, "newsroom"), "a name is not a prefix");
        assert!(!g.allows(Scope::Admin, "news"));
        assert!(!g.allows(Scope::Read, "wire"), "`wire-*` needs the dash");
        assert!(!g.sees_unowned());
        let err = g.require(Scope::Read, "hr").unwrap_err().to_string();
        assert_eq!(err, "token `desk` (write) may not read space `hr`");
        let root = a.authenticate(Some(b"bearer   root ")).unwrap();
        assert!(root.allows(Scope::Admin, "anything") && root.sees_unowned());
    }

    #[test]
    fn unknown_missing_and_malformed_tokens_are_refused() {
        let a = access(&[("desk", "s3cret", Scope::Read, &["news"])]);
        assert_eq!(a.authenticate(None).unwrap_err(), Unauthenticated::Missing);
        assert_eq!(a.authenticate(Some(b"Basic czNjcmV0")).unwrap_err(), Unauthenticated::Malformed);
        assert_eq!(a.authenticate(Some(b"Bearer ")).unwrap_err(), Unauthenticated::Malformed);
        assert_eq!(a.authenticate(Some(b"Bearer s3cre")).unwrap_err(), Unauthenticated::Unknown);
        assert_eq!(a.authenticate(Some(b"Bearer s3cret2")).unwrap_err(), Unauthenticated::Unknown);
        // The hash itself is not a token.
        let hash = hash_token("s3cret");
        assert_eq!(a.authenticate(Some(format!("Bearer {hash}").as_bytes())).unwrap_err(), Unauthenticated::Unknown);
        assert!(matches!(Access::default().authenticate(None), Ok(Grant::Open)));
    }

    #[test]
    fn bad_token_config_is_reported_naming_the_token() {
        let bad = AuthConfig {
            tokens: vec![
                TokenConfig {
                    name: "plain".into(),
                    hash: "s3cret".into(),
                    scope: Scope::Read,
                    spaces: vec!["news".into()],
                    max_spaces: 0,
                },
                TokenConfig {
                    name: "nowhere".into(),
                    hash: hash_token("x"),
                    scope: Scope::Read,
                    spaces: vec![],
                    max_spaces: 0,
                },
                TokenConfig {
                    name: "odd".into(),
                    hash: hash_token("y"),
                    scope: Scope::Read,
                    spaces: vec!["a/b".into()],
                    max_spaces: 0,
                },
            ],
            ..Default::default()
        };
        let errors = Access::load(&bad).unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].contains("`plain`") && errors[0].contains("64 hex digits"));
        assert!(errors[1].contains("`nowhere`") && errors[1].contains("`spaces` is empty"));
        assert!(errors[2].contains("`odd`") && errors[2].contains("`a/b`"));
    }

    #[test]
    fn the_tokens_file_is_read_and_a_bad_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let text = format!(
            "[[tokens]]\nname = \"desk\"\nhash = \"{}\"\nscope = \"read\"\nspaces = [\"news\"]\n",
            hash_token("t1")
        );
        std::fs::write(&path, text).unwrap();
        let config = AuthConfig { tokens_file: path.display().to_string(), ..Default::default() };
        let a = Access::load(&config).unwrap();
        assert!(a.authenticate(Some(b"Bearer t1")).unwrap().allows(Scope::Read, "news"));
        std::fs::write(&path, "[[tokens]]\nname = 1\n").unwrap();
        let errors = Access::load(&config).unwrap_err();
        assert!(errors[0].starts_with("auth.tokens-file = "), "{errors:?}");
        let missing = AuthConfig { tokens_file: "/nonexistent/tokens.toml".into(), ..Default::default() };
        assert!(Access::load(&missing).unwrap_err()[0].contains("cannot read it"));
    }

    #[test]
    fn without_tokens_only_loopback_is_served() {
        let open = Access::default();
        let config = AuthConfig::default();
        assert!(check_listen("127.0.0.1:7600".parse().unwrap(), &open, &config).is_ok());
        assert!(check_listen("[::1]:7600".parse().unwrap(), &open, &config).is_ok());
        let err = check_listen("0.0.0.0:7600".parse().unwrap(), &open, &config).unwrap_err();
        assert!(err.contains("not a loopback address") && err.contains("auth.allow-unauthenticated"), "{err}");
        let opted = AuthConfig { allow_unauthenticated: true, ..Default::default() };
        assert!(check_listen("0.0.0.0:7600".parse().unwrap(), &open, &opted).is_ok());
        let closed = access(&[("desk", "t", Scope::Read, &["*"])]);
        assert!(check_listen("0.0.0.0:7600".parse().unwrap(), &closed, &config).is_ok());
    }

    #[test]
    fn new_tokens_are_distinct_and_hash_to_64_hex_digits() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert_eq!(a.len(), 47);
        assert!(parse_hash(&hash_token(&a)).is_some());
    }
}
