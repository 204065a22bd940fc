//! What every operator command shares about its output: exit codes, `-o table|json` (and for
//! lists, kubectl's `-o table|wide|json|yaml|name`), tables.

use clap::ValueEnum;
use serde_json::{Value, json};

/// Exit codes scripts can rely on: 0 success; 1 the operation failed or `doctor` found a problem;
/// 2 usage error; 3 refused (`release` of an address whose pod may be alive, without `--force`).
pub const EXIT_OK: i32 = 0;
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_REFUSED: i32 = 3;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

/// How a list (`tether leases`, `tether pools`) is printed, as kubectl prints one.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListOutput {
    Table,
    /// The table with more columns.
    Wide,
    /// `{"kind": "…List", "items": […]}`.
    Json,
    Yaml,
    /// One name per line, as the commands that act on one item take it.
    Name,
}

/// Print `items` as JSON or YAML: an object of `kind` with the items in `items`, as kubectl prints a
/// list (a script reads `.items[]`, and a later key never breaks it).
pub fn print_items(kind: &str, items: Vec<Value>, yaml: bool) -> Result<(), String> {
    let list = json!({ "kind": kind, "items": items });
    if yaml {
        let text = serde_saphyr::to_string(&list).map_err(|e| format!("writing YAML: {e}"))?;
        print!("{text}");
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(&list).map_err(|e| format!("writing JSON: {e}"))?
        );
    }
    Ok(())
}

/// A plain aligned table.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r.clone());
    }
}
