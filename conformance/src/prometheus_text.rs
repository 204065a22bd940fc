//! The Prometheus text format, as the API server's and the agents' `/metrics` write it.

use std::collections::BTreeMap;

/// `a="x",b="y"` → map (values unescaped for `\"` and `\\`).
pub fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while let Some((k, v)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = v.char_indices();
        let mut end = v.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(if n == 'n' { '\n' } else { n });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(k.trim_start_matches(',').trim().to_string(), value);
        rest = &v[end..];
    }
    out
}
