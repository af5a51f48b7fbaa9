//! The rule table of `ui-tests/README.md` and the compile-fail cases agree: every case file
//! (`ui-tests/<area>/<name>.rs`) is named in a row of the table, every case a row names
//! (`` `<area>/<name>` `` in its "case" column) has a file, every row names a case or says "none"
//! (a rule checked at run time), and a row's "error" column names the code its cases' `.stderr`
//! files report.
//!
//! Needs no GPU: it reads files only. They are found beside the crate's manifest, so the test skips
//! visibly where the binary runs away from the source tree (a bundled test binary on another machine).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A row of the table: its line number in the README, the cases its "case" column names, whether
/// that column says "none" (a run-time rule), and its "error" column.
struct Row {
    line: usize,
    cases: Vec<String>,
    none: bool,
    error: String,
}

/// The cells of a Markdown table line (`| a | b |`), trimmed; `None` for any other line.
fn cells(line: &str) -> Option<Vec<&str>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(str::trim).collect())
}

/// The backticked spans of `text` that have the shape of a case, `<area>/<name>`: lowercase
/// letters, digits and underscores on both sides of one slash (so not `tests/waits.rs`).
fn case_names(text: &str) -> Vec<String> {
    let is_part = |part: &str| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            span.split_once('/')
                .is_some_and(|(area, name)| is_part(area) && is_part(name))
        })
        .map(str::to_owned)
        .collect()
}

/// Where [`rows`] is in the README.
enum Table {
    /// Outside a table, or at the header line of the next one.
    Outside,
    /// In a table without a "case" column.
    Other,
    /// In the rule table: the indices of its "case" and "error" columns.
    Rules { case: usize, error: Option<usize> },
}

/// The rows of every table in `readme` whose header has a "case" column.
fn rows(readme: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut table = Table::Outside;
    for (index, line) in readme.lines().enumerate() {
        let Some(row) = cells(line) else {
            table = Table::Outside;
            continue;
        };
        if row
            .iter()
            .all(|cell| cell.chars().all(|c| c == '-' || c == ':'))
        {
            continue; // the separator line under a header
        }
        match table {
            Table::Outside => {
                let column = |name: &str| row.iter().position(|cell| *cell == name);
                table = match column("case") {
                    Some(case) => Table::Rules {
                        case,
                        error: column("error"),
                    },
                    None => Table::Other,
                };
            }
            Table::Other => {}
            Table::Rules { case, error } => {
                let cell = row.get(case).copied().unwrap_or_default();
                rows.push(Row {
                    line: index + 1,
                    cases: case_names(cell),
                    none: cell.starts_with("none"),
                    error: error
                        .and_then(|error| row.get(error))
                        .copied()
                        .unwrap_or_default()
                        .to_owned(),
                });
            }
        }
    }
    rows
}

/// Every case file, `area/name` for `ui-tests/<area>/<name>.rs`, with its path.
fn case_files(ui: &Path) -> BTreeMap<String, PathBuf> {
    let mut files = BTreeMap::new();
    for area in fs::read_dir(ui).expect("ui-tests/ is readable") {
        let area = area.expect("ui-tests/ lists its entries");
        if !area.file_type().is_ok_and(|kind| kind.is_dir()) {
            continue;
        }
        let area_name = area
            .file_name()
            .into_string()
            .expect("area names are UTF-8");
        for file in fs::read_dir(area.path()).expect("an area is readable") {
            let path = file.expect("an area lists its entries").path();
            if path.extension().is_some_and(|ext| ext == "rs") {
                let stem = path
                    .file_stem()
                    .and_then(|stem| stem.to_str())
                    .expect("case names are UTF-8")
                    .to_owned();
                files.insert(format!("{area_name}/{stem}"), path);
            }
        }
    }
    files
}

#[test]
fn rule_table_names_every_case_and_only_cases() {
    let ui = Path::new(env!("CARGO_MANIFEST_DIR")).join("ui-tests");
    if !ui.is_dir() {
        println!("SKIPPED rule_table: ui-tests/ not found beside the test binary");
        return;
    }
    let readme = fs::read_to_string(ui.join("README.md")).expect("ui-tests/README.md is readable");
    let rows = rows(&readme);
    let files = case_files(&ui);
    assert!(
        !rows.is_empty(),
        "ui-tests/README.md has no table with a \"case\" column"
    );
    assert!(!files.is_empty(), "ui-tests/ holds no case files");

    let mut problems = Vec::new();
    let mut named = BTreeSet::new();
    for row in &rows {
        if row.cases.is_empty() && !row.none {
            problems.push(format!(
                "ui-tests/README.md:{}: the row names no case and does not say \"none\"",
                row.line
            ));
        }
        for case in &row.cases {
            named.insert(case.as_str());
            let Some(path) = files.get(case) else {
                problems.push(format!(
                    "ui-tests/README.md:{}: the row names `{case}`, but ui-tests/{case}.rs does not exist",
                    row.line
                ));
                continue;
            };
            // The "error" column gives the code the case's compiler answer starts with.
            if row.error.starts_with('E') {
                let stderr = fs::read_to_string(path.with_extension("stderr")).unwrap_or_default();
                if !stderr.contains(&format!("error[{}]", row.error)) {
                    problems.push(format!(
                        "ui-tests/README.md:{}: the row says {} for `{case}`, but ui-tests/{case}.stderr does not report it",
                        row.line, row.error
                    ));
                }
            }
        }
    }
    for case in files.keys() {
        if !named.contains(case.as_str()) {
            problems.push(format!(
                "ui-tests/{case}.rs is named in no row of ui-tests/README.md"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the rule table and the cases disagree:\n{}",
        problems.join("\n")
    );
    println!(
        "rule_table: {} rows, {} cases, all named",
        rows.len(),
        files.len()
    );
}

#[test]
fn case_names_are_recognised() {
    assert_eq!(
        case_names("`stream/view_written_while_lent`, `tests/waits.rs`, `Error::PageRange`"),
        ["stream/view_written_while_lent"]
    );
    let table = "| rule | case | error |\n| --- | --- | --- |\n| a | `vmm/a_b`, `vmm/c` | E0505 |\n| b | none: run time | run time |\n\n| x |\n| --- |\n| `vmm/ignored` |\n";
    let rows = rows(table);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].cases, ["vmm/a_b", "vmm/c"]);
    assert_eq!(rows[0].error, "E0505");
    assert!(rows[1].none && rows[1].cases.is_empty());
}
