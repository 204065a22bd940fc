//! Query strings: decoding, and the hex encoding names take inside `continue` tokens.

use std::collections::BTreeMap;

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
    fn decode() {
        assert_eq!(percent_decode("a%3Db%2Cc+d%2F"), "a=b,c d/");
        assert_eq!(percent_decode("100%"), "100%");
        let q = parse_query(Some(
            "labelSelector=ipam.tether.dev%2Fnetwork%3Dnet-a&limit=5",
        ));
        assert_eq!(q["labelSelector"], "ipam.tether.dev/network=net-a");
        assert_eq!(q["limit"], "5");
        assert_eq!(unhex(&hex("a/b")).unwrap(), "a/b");
    }
}
