//! The crate's modules depend one way, as its docs draw them: a module names only modules of its
//! own layer or below (`stream` knows what it lends by trait and never names `owned`), no file names
//! an item through the crate root's shortcuts (`crate::Device` from inside the crate: name the
//! module, `crate::device::Device`), and no files import each other in a circle.
//!
//! It reads `src/` as text: every `use` and every path that starts with `crate::`, `super::` or
//! `self::` in code (comments, doc comments, string and character literals are dropped first, and a
//! `use` under `#[cfg(doc)]` counts as documentation), resolved to the file of the module it names.
//! A parent's `pub use child::Item` that the parent does not use itself is a re-export, not a
//! dependency. Needs no GPU. The files are found beside the crate's manifest, so the test skips
//! visibly where the binary runs away from the source tree.
//!
//! `LAYERS_PRINT=1` prints the graph of files.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules, lowest layer first; a module names only modules of its own layer or of
/// a layer before it. Within a layer the modules do not name each other in a circle either (the
/// cycle check below sees every file).
const LAYERS: &[&[&str]] = &[
    &["sys", "raw", "safety_model"],
    &["error"],
    &["wait"],
    &["device"],
    &["view", "module"],
    &["vmm"],
    &["host"],
    &["stream"],
    &["peer", "ipc"],
    &["owned"],
    &["interop"],
];

/// One file of `src/`: its module path (`["stream", "lend"]` for `src/stream/lend.rs`) and text.
struct File {
    module: Vec<String>,
    path: PathBuf,
    text: String,
}

fn files(src: &Path) -> Vec<File> {
    let mut found = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("a directory lists its entries").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(src).expect("under src/");
                let mut module: Vec<String> = relative
                    .with_extension("")
                    .iter()
                    .map(|part| part.to_string_lossy().into_owned())
                    .collect();
                if module
                    .last()
                    .is_some_and(|last| last == "lib" || last == "mod")
                {
                    module.pop();
                }
                let text = fs::read_to_string(&path).expect("a source file is readable");
                found.push(File { module, path, text });
            }
        }
    }
    found.sort_by(|a, b| a.module.cmp(&b.module));
    found
}

/// `text` with comments, string literals and character literals blanked (newlines kept).
fn code(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"...", r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some(&other) => {
                        out.push(blank(other));
                        j += 1;
                    }
                }
            }
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if let Some(&inner) = chars.get(i) {
                    out.push(blank(inner));
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\''), or a lifetime ('a), which is kept.
            let literal = match (next, chars.get(i + 2), chars.get(i + 3)) {
                (Some('\\'), _, _) => chars[i + 2..]
                    .iter()
                    .position(|&c| c == '\'')
                    .map(|p| p + 3),
                (Some(_), Some('\''), _) => Some(3),
                _ => None,
            };
            if let Some(len) = literal {
                i += len;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The leaf paths of a `use` tree (`a::{b, c::{d, e as f}, self}` gives `a::b`, `a::c::d`,
/// `a::c::e`, `a`), each as its segments.
fn use_leaves(tree: &str) -> Vec<Vec<String>> {
    fn walk(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if tree.is_empty() {
            return;
        }
        if let Some(open) = tree.find('{') {
            let head: Vec<String> = tree[..open]
                .split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut prefix = prefix.to_vec();
            prefix.extend(head);
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        walk(&prefix, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            walk(&prefix, &inner[start..], out);
            return;
        }
        let tree = tree.split(" as ").next().unwrap_or(tree);
        let mut path = prefix.to_vec();
        for segment in tree.split("::").map(str::trim) {
            if segment == "self" && !path.is_empty() {
                continue;
            }
            if segment != "*" {
                path.push(segment.to_owned());
            }
        }
        out.push(path);
    }
    let mut out = Vec::new();
    walk(&[], tree, &mut out);
    out
}

/// A path found in a file: its segments, where in the file's modules it stands, and whether it is
/// only re-exported (a `pub use` of a name the file does not use otherwise).
struct Found {
    segments: Vec<String>,
    module: Vec<String>,
    line: usize,
    reexport: bool,
}

/// The inline modules of `code` (`mod name { ... }`): their name and byte range.
fn inline_modules(code: &str) -> Vec<(String, usize, usize)> {
    let bytes = code.as_bytes();
    let mut inline = Vec::new();
    let mut at = 0;
    while let Some(found) = code[at..].find("mod ") {
        let start = at + found;
        at = start + 4;
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue;
        }
        let rest = &code[start + 4..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let after = rest[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = start + 4 + rest.find('{').expect("checked above");
        let mut depth = 0;
        let mut end = code.len();
        for (i, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        inline.push((name, open, end));
    }
    inline
}

/// A `use` statement of `code`: the byte range of its line(s), where the tree starts and ends,
/// whether it is `pub` (a re-export, unless the file uses the name itself), and whether
/// `#[cfg(doc)]` stands on the line before (documentation only).
struct UseStatement {
    line_start: usize,
    start: usize,
    end: usize,
    public: bool,
    doc_only: bool,
}

fn use_statements(code: &str) -> Vec<UseStatement> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(hit) = code[at..].find("use ") {
        let start = at + hit;
        at = start + 4;
        let before = code[..start].trim_end();
        let statement_start = before.is_empty()
            || [";", "{", "}", "]", "pub", ")"]
                .iter()
                .any(|end| before.ends_with(end));
        if !statement_start
            || (start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_'))
        {
            continue;
        }
        let Some(len) = code[start..].find(';') else {
            continue;
        };
        let line_start = code[..start].rfind('\n').map_or(0, |n| n + 1);
        let previous = code[..line_start.saturating_sub(1)]
            .rsplit('\n')
            .next()
            .unwrap_or("")
            .trim();
        found.push(UseStatement {
            line_start,
            start,
            end: start + len,
            public: code[line_start..start].trim().starts_with("pub"),
            doc_only: previous == "#[cfg(doc)]",
        });
    }
    found
}

/// Whether `name` stands as a whole word in `text`.
fn mentions(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// Every path of `file` that names a module of the crate: its `use` leaves and its inline
/// `crate::`, `super::` and `self::` paths.
fn paths(file: &File) -> Vec<Found> {
    let code = code(&file.text);
    let bytes = code.as_bytes();
    let inline = inline_modules(&code);
    let module_at = |offset: usize| -> Vec<String> {
        let mut enclosing: Vec<&(String, usize, usize)> = inline
            .iter()
            .filter(|(_, open, end)| *open < offset && offset < *end)
            .collect();
        enclosing.sort_by_key(|(_, open, _)| *open);
        let mut module = file.module.clone();
        module.extend(enclosing.iter().map(|(name, _, _)| name.clone()));
        module
    };
    let line_of = |offset: usize| code[..offset].matches('\n').count() + 1;
    let uses = use_statements(&code);
    // The file without its `use` statements: where a re-exported name would be used.
    let mut elsewhere = String::new();
    let mut last = 0;
    for statement in &uses {
        elsewhere.push_str(&code[last..statement.line_start.max(last)]);
        last = statement.end;
    }
    elsewhere.push_str(&code[last..]);
    // Without `mod name;` declarations, which name a module, not a use of it.
    let elsewhere: String = elsewhere
        .lines()
        .filter(|line| {
            let line = line.trim();
            !(line.ends_with(';') && line.trim_start_matches("pub(crate) ").starts_with("mod "))
        })
        .collect::<Vec<_>>()
        .join("\n");

    let mut found = Vec::new();
    for statement in uses.iter().filter(|s| !s.doc_only) {
        for segments in use_leaves(&code[statement.start + 4..statement.end]) {
            let name = segments.last().cloned().unwrap_or_default();
            found.push(Found {
                reexport: statement.public && !mentions(&elsewhere, &name),
                segments,
                module: module_at(statement.start),
                line: line_of(statement.start),
            });
        }
    }
    for prefix in ["crate::", "super::", "self::"] {
        for (offset, _) in code.match_indices(prefix) {
            let glued = offset > 0
                && (bytes[offset - 1].is_ascii_alphanumeric()
                    || bytes[offset - 1] == b'_'
                    || bytes[offset - 1] == b':');
            // In a `use` (read above), or a visibility: `pub(in crate::owned::buffer)`.
            let elsewhere_read = uses
                .iter()
                .any(|s| s.line_start <= offset && offset < s.end)
                || code[..offset].trim_end().ends_with("pub(in");
            if glued || elsewhere_read {
                continue;
            }
            let text: String = code[offset..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            found.push(Found {
                segments: text
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
                module: module_at(offset),
                line: line_of(offset),
                reexport: false,
            });
        }
    }
    found
}

/// What a path names: the file of the deepest module of the crate it goes through, and whether it
/// names an item of the crate root (a root shortcut). `None` for a path outside the crate.
fn resolve(
    path: &Found,
    file_module: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<(Vec<String>, bool)> {
    let mut segments = path.segments.iter().peekable();
    let mut base: Vec<String> = match segments.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segments.next();
            Vec::new()
        }
        Some("super" | "self") => {
            let mut base = path.module.clone();
            while let Some(&step) = segments.peek() {
                match step.as_str() {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                segments.next();
            }
            base
        }
        Some(first) => {
            // A relative `use` of a child module (`use page::Memory;`).
            let mut child = path.module.clone();
            child.push(first.to_owned());
            if modules.contains(&child) {
                path.module.clone()
            } else {
                return None;
            }
        }
        None => return None,
    };
    // Inline modules live in their file: resolve up to a file module.
    while !modules.contains(&base) && !base.is_empty() {
        base.pop();
    }
    let mut through_module = false;
    for segment in segments {
        let mut next = base.clone();
        next.push(segment.clone());
        if modules.contains(&next) {
            base = next;
            through_module = true;
        } else {
            break;
        }
    }
    let root_item = base.is_empty() && !through_module && file_module != [] as [String; 0];
    Some((base, root_item))
}

fn layer(module: &[String]) -> Option<usize> {
    let top = module.first()?;
    LAYERS
        .iter()
        .position(|layer| layer.contains(&top.as_str()))
}

#[test]
fn modules_depend_one_way_without_circles_or_root_shortcuts() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    if !src.is_dir() {
        println!("SKIPPED layers: src/ not found beside the test binary");
        return;
    }
    let files = files(&src);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| f.module.clone()).collect();
    let name = |module: &[String]| {
        if module.is_empty() {
            "crate".to_owned()
        } else {
            module.join("::")
        }
    };
    let mut problems = Vec::new();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let shown = file
            .path
            .strip_prefix(&src)
            .unwrap_or(&file.path)
            .display()
            .to_string();
        for path in paths(file) {
            let Some((target, root_item)) = resolve(&path, &file.module, &modules) else {
                continue;
            };
            if root_item && !path.reexport {
                problems.push(format!(
                    "src/{shown}:{}: `{}` names an item through the crate root: name its module",
                    path.line,
                    path.segments.join("::")
                ));
                continue;
            }
            if target == file.module || path.reexport {
                continue;
            }
            if let (Some(from), Some(to)) = (layer(&file.module), layer(&target))
                && to > from
            {
                problems.push(format!(
                    "src/{shown}:{}: `{}` names `{}`, a layer above `{}`",
                    path.line,
                    path.segments.join("::"),
                    name(&target),
                    name(&file.module[..1]),
                ));
            }
            if !target.is_empty() {
                edges.entry(file.module.clone()).or_default().insert(target);
            }
        }
        if let Some(top) = file.module.first()
            && layer(&file.module).is_none()
        {
            problems.push(format!(
                "src/{shown}: module `{top}` is in no layer of LAYERS"
            ));
        }
    }
    if std::env::var_os("LAYERS_PRINT").is_some() {
        for (from, to) in &edges {
            let to: Vec<String> = to.iter().map(|t| name(t)).collect();
            println!("{} -> {}", name(from), to.join(", "));
        }
    }
    for cycle in cycles(&edges) {
        let names: Vec<String> = cycle.iter().map(|m| name(m)).collect();
        problems.push(format!(
            "these files import each other in a circle: {}",
            names.join(", ")
        ));
    }
    assert!(
        problems.is_empty(),
        "the module graph has {} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
    println!(
        "layers: {} files, {} edges between files, no circle, no upward name",
        files.len(),
        edges.values().map(BTreeSet::len).sum::<usize>()
    );
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct State<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        next: usize,
        found: Vec<Vec<Vec<String>>>,
    }
    fn visit<'a>(state: &mut State<'a>, node: &'a Vec<String>) {
        state.index.insert(node, state.next);
        state.low.insert(node, state.next);
        state.next += 1;
        state.stack.push(node);
        state.on_stack.insert(node);
        if let Some(targets) = state.edges.get(node) {
            for target in targets {
                if !state.index.contains_key(target) {
                    visit(state, target);
                    let low = state.low[node].min(state.low[target]);
                    state.low.insert(node, low);
                } else if state.on_stack.contains(target) {
                    let low = state.low[node].min(state.index[target]);
                    state.low.insert(node, low);
                }
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.push(member.clone());
                if member == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.found
}

#[test]
fn the_reader_finds_uses_paths_and_circles() {
    assert_eq!(
        use_leaves("a::{b, c::{d, e as f}, self}"),
        [
            vec!["a", "b"],
            vec!["a", "c", "d"],
            vec!["a", "c", "e"],
            vec!["a"]
        ]
    );
    let stripped =
        code("let s = \"crate::x\"; // crate::y\nlet c = '\"'; crate::z::W; r#\"super::q\"#");
    assert!(!stripped.contains("crate::x") && !stripped.contains("crate::y"));
    assert!(!stripped.contains("super::q"));
    assert!(stripped.contains("crate::z::W"));
    let file = File {
        module: vec!["stream".into(), "lend".into()],
        path: PathBuf::from("stream/lend.rs"),
        text: "pub use inner::Out;\npub use child::Child;\nmod child;\nuse super::Stream;\nmod inner { use super::Thing; }\n#[cfg(doc)]\nuse crate::owned::X;\nfn f() { crate::device::Device::get(0); }\n"
            .to_owned(),
    };
    let found: Vec<(String, Vec<String>, bool)> = paths(&file)
        .into_iter()
        .map(|p| (p.segments.join("::"), p.module, p.reexport))
        .collect();
    let stream = vec!["stream".to_owned()];
    let lend = vec!["stream".to_owned(), "lend".to_owned()];
    let inner = vec!["stream".to_owned(), "lend".to_owned(), "inner".to_owned()];
    assert!(
        found.contains(&("inner::Out".into(), lend.clone(), true)),
        "{found:?}"
    );
    assert!(
        found.contains(&("child::Child".into(), lend.clone(), true)),
        "a `mod child;` line is no use of a re-export"
    );
    assert!(found.contains(&("super::Stream".into(), lend.clone(), false)));
    assert!(found.contains(&("super::Thing".into(), inner, false)));
    assert!(found.contains(&("crate::device::Device::get".into(), lend.clone(), false)));
    assert!(
        !found.iter().any(|f| f.0.contains("owned")),
        "a cfg(doc) use"
    );
    let modules: BTreeSet<Vec<String>> = [
        vec![],
        stream.clone(),
        lend.clone(),
        vec!["device".to_owned()],
    ]
    .into_iter()
    .collect();
    let at = |segments: &str, module: &[String]| Found {
        segments: segments.split("::").map(str::to_owned).collect(),
        module: module.to_vec(),
        line: 1,
        reexport: false,
    };
    assert_eq!(
        resolve(&at("super::Stream", &lend), &lend, &modules),
        Some((stream.clone(), false))
    );
    assert_eq!(
        resolve(&at("crate::Device", &lend), &lend, &modules),
        Some((vec![], true)),
        "a root shortcut"
    );
    assert_eq!(resolve(&at("core::fmt", &lend), &lend, &modules), None);
    let mut edges = BTreeMap::new();
    edges.insert(stream.clone(), BTreeSet::from([lend.clone()]));
    edges.insert(lend.clone(), BTreeSet::from([stream.clone()]));
    assert_eq!(cycles(&edges), vec![vec![stream.clone(), lend.clone()]]);
    edges.remove(&lend);
    assert!(cycles(&edges).is_empty());
}
