//! The rule table of `ui-tests/README.md` and the compile-fail cases agree: every case file
//! (`ui-tests/<area>/<name>.rs`) is named in a row of the table, every case a row names
//! (`` `<area>/<name>` `` in its "case" column) has a file, every row names a case or says "none"
//! (a rule checked at run time), and a row's "error" column names the code its cases' `.stderr`
//! files report. Every run-time row (its "error" column says "run time") names the GPU test that
//! proves it: a test file
//! (`` `tests/<file>.rs` ``) followed by the names of test functions in it
//! (`` `tests/in_motion.rs` `scoped_views_are_checked_before_the_driver` ``), each of which must
//! exist in that file.
//!
//! Needs no GPU: it reads files only. They are found beside the crate's manifest, so the test skips
//! visibly where the binary runs away from the source tree (a bundled test binary on another machine).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A row of the table: its line number in the README, the cases its "case" column names, whether
/// that column says "none" (a run-time rule), the GPU tests it names, and its "error" column.
struct Row {
    line: usize,
    cases: Vec<String>,
    none: bool,
    tests: Vec<(String, String)>,
    error: String,
}

/// The tests `text` names: each `` `tests/<file>.rs` `` followed by backticked function names
/// (separated by spaces or commas), as `(file, function)` pairs.
fn test_names(text: &str) -> Vec<(String, String)> {
    let parts: Vec<&str> = text.split('`').collect();
    let mut names = Vec::new();
    let mut file: Option<&str> = None;
    // Odd indices are backticked spans, even ones the text between them.
    for (index, part) in parts.iter().enumerate() {
        if index % 2 == 0 {
            if !part.chars().all(|c| c == ' ' || c == ',') {
                file = None;
            }
            continue;
        }
        let is_file = part
            .strip_prefix("tests/")
            .and_then(|rest| rest.strip_suffix(".rs"))
            .is_some_and(|name| !name.is_empty() && !name.contains('/'));
        if is_file {
            file = Some(part);
        } else if let Some(file) = file {
            let is_fn = !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if is_fn {
                names.push((file.to_owned(), (*part).to_owned()));
            }
        }
    }
    names
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
                    tests: test_names(cell),
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
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for row in rows
        .iter()
        .filter(|row| row.none && row.error == "run time")
    {
        if row.tests.is_empty() {
            problems.push(format!(
                "ui-tests/README.md:{}: a run-time row that names no GPU test (`tests/<file>.rs` `<function>`)",
                row.line
            ));
        }
        for (file, function) in &row.tests {
            let source = fs::read_to_string(root.join(file)).unwrap_or_default();
            if !source.contains(&format!("fn {function}(")) {
                problems.push(format!(
                    "ui-tests/README.md:{}: the row names `{file}` `{function}`, but {file} has no such function",
                    row.line
                ));
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
        "rule_table: {} rows, {} cases, all named; {} run-time rows, each naming its GPU tests",
        rows.len(),
        files.len(),
        rows.iter()
            .filter(|row| row.none && row.error == "run time")
            .count()
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
    assert!(rows[1].tests.is_empty());
    let pair = |file: &str, function: &str| (file.to_owned(), function.to_owned());
    assert_eq!(
        test_names(
            "none: checked (`Error::PageRange`; GPU tests `tests/a.rs` `x_y`, `z`, `tests/b.rs`, `w` and `not_a_test` here)"
        ),
        [
            pair("tests/a.rs", "x_y"),
            pair("tests/a.rs", "z"),
            pair("tests/b.rs", "w")
        ]
    );
}
