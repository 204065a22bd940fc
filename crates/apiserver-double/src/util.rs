//! Small helpers: query strings, selectors, names, timestamps, UIDs.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// Decode `application/x-www-form-urlencoded` text (`+` is a space, `%XX` a byte).
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse a query string into key → value (last one wins).
pub fn parse_query(q: Option<&str>) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        m.insert(percent_decode(k), percent_decode(v));
    }
    m
}

/// One term of a label or field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// `key=value` or `key==value`.
    Eq(String, String),
    /// `key!=value` (true when the key is absent).
    Ne(String, String),
    /// `key` (label selectors only).
    Exists(String),
    /// `!key` (label selectors only).
    NotExists(String),
}

/// Parse a selector: comma-separated equality-based terms. Set-based terms (`in`, `notin`) are
/// not supported by the double and give an error.
pub fn parse_selector(s: &str, allow_existence: bool) -> Result<Vec<Term>, String> {
    let mut terms = Vec::new();
    for raw in s.split(',') {
        let t = raw.trim();
        if t.is_empty() {
            continue;
        }
        if t.contains(" in ") || t.contains(" notin ") || t.contains('(') {
            return Err(format!(
                "set-based selector term {t:?} is not supported by the double"
            ));
        }
        let term = if let Some((k, v)) = t.split_once("!=") {
            Term::Ne(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = t.split_once("==") {
            Term::Eq(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = t.split_once('=') {
            Term::Eq(k.trim().to_string(), v.trim().to_string())
        } else if !allow_existence {
            return Err(format!(
                "invalid field selector term {t:?}: expected key=value or key!=value"
            ));
        } else if let Some(k) = t.strip_prefix('!') {
            Term::NotExists(k.trim().to_string())
        } else {
            Term::Exists(t.to_string())
        };
        let key = match &term {
            Term::Eq(k, _) | Term::Ne(k, _) | Term::Exists(k) | Term::NotExists(k) => k,
        };
        if key.is_empty() {
            return Err(format!("selector term {t:?} has an empty key"));
        }
        terms.push(term);
    }
    Ok(terms)
}

/// Does `lookup` (key → value) satisfy every term?
pub fn matches(terms: &[Term], lookup: impl Fn(&str) -> Option<String>) -> bool {
    terms.iter().all(|t| match t {
        Term::Eq(k, v) => lookup(k).as_deref() == Some(v.as_str()),
        Term::Ne(k, v) => lookup(k).as_deref() != Some(v.as_str()),
        Term::Exists(k) => lookup(k).is_some(),
        Term::NotExists(k) => lookup(k).is_none(),
    })
}

/// A label of `obj`.
pub fn label(obj: &Value, key: &str) -> Option<String> {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// A field of `obj` by dotted path (`spec.nodeName`), as text.
pub fn field(obj: &Value, path: &str) -> Option<String> {
    let mut cur = obj;
    for part in path.split('.') {
        cur = cur.get(part)?;
    }
    match cur {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// Is `name` a valid DNS-1123 subdomain (what Kubernetes requires of most object names)?
pub fn is_dns_subdomain(name: &str) -> bool {
    if name.is_empty() || name.len() > 253 {
        return false;
    }
    name.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    })
}

/// Current time as RFC 3339 (`2024-01-02T03:04:05Z`).
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// Unix seconds as RFC 3339, UTC.
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// A random version-4 UUID.
pub fn uuid4() -> String {
    let a = random_u64();
    let b = random_u64();
    let bytes: Vec<u8> = a.to_le_bytes().into_iter().chain(b.to_le_bytes()).collect();
    let mut h: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    // version 4, variant 10xx
    h.replace_range(12..13, "4");
    let v = u8::from_str_radix(&h[16..17], 16).unwrap_or(0) & 0x3 | 0x8;
    h.replace_range(16..17, &format!("{v:x}"));
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// Lowercase hex of `s` (continue tokens carry names this way).
pub fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Inverse of [`hex`].
pub fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_and_select() {
        assert_eq!(percent_decode("a%3Db%2Cc+d%2F"), "a=b,c d/");
        assert_eq!(percent_decode("100%"), "100%");
        let q = parse_query(Some(
            "labelSelector=ipam.tether.dev%2Fnetwork%3Dnet-a&limit=5",
        ));
        assert_eq!(q["labelSelector"], "ipam.tether.dev/network=net-a");
        assert_eq!(q["limit"], "5");
        let t = parse_selector("a=1,b!=2,c,!d", true).unwrap();
        assert_eq!(t.len(), 4);
        let obj = serde_json::json!({"metadata": {"labels": {"a": "1", "c": ""}}});
        assert!(matches(&t, |k| label(&obj, k)));
        assert!(parse_selector("a in (x)", true).is_err());
        assert!(parse_selector("a", false).is_err());
    }

    #[test]
    fn names_times_ids() {
        assert!(is_dns_subdomain("net-a.10.0.0.1"));
        assert!(!is_dns_subdomain("Net"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain("a..b"));
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        let u = uuid4();
        assert_eq!(u.len(), 36);
        assert_ne!(u, uuid4());
        assert_eq!(unhex(&hex("a/b")).unwrap(), "a/b");
    }
}
