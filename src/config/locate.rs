//! Turning a byte offset into "line 12, pipeline \"sync\", step \"copy\",
//! key `run`".
//!
//! serde reports where a value went wrong but not which pipeline it belongs
//! to, so the document is also parsed into toml's spanned tree and the
//! offset is looked up there. `[[pipeline]]` tables only carry the span of
//! their header, so an element's extent is the union of everything under it.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// A problem and where it is (byte offset into the text).
#[derive(Debug)]
pub(super) struct Located {
    pub offset: Option<usize>,
    pub message: String,
}

impl Located {
    pub fn at(offset: usize, message: impl Into<String>) -> Self {
        Located {
            offset: Some(offset),
            message: message.into(),
        }
    }
}

pub(super) type Tree<'i> = Spanned<DeTable<'i>>;

pub(super) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Syntax check; the tree is kept to explain later errors.
pub(super) fn parse_tree(text: &str) -> Result<Tree<'_>, Located> {
    DeTable::parse(text).map_err(|e| Located {
        offset: e.span().map(|s| s.start),
        message: format!("invalid TOML: {}", e.message()),
    })
}

/// A deserialisation error with the place it happened spelled out.
pub(super) fn explain(tree: &Tree<'_>, err: &toml::de::Error) -> Located {
    let offset = err.span().map(|s| s.start);
    let mut path = match offset {
        Some(o) => path_to(tree.get_ref(), o),
        None => Vec::new(),
    };
    let raw = err.message().trim();
    let message = if let Some(rest) = raw.strip_prefix("unknown field ") {
        // The span is the key itself: naming it twice reads badly.
        if let (Some(Segment::Key(k)), Some(name)) = (path.last(), backticked(rest))
            && k == name
        {
            path.pop();
        }
        reword_unknown(rest)
    } else if let Some(rest) = raw.strip_prefix("missing field ") {
        format!("missing key {rest}")
    } else {
        plain_words(raw)
    };
    let mut out: Vec<String> = path.iter().map(Segment::to_string).collect();
    out.push(message);
    Located {
        offset,
        message: out.join(": "),
    }
}

/// "`runn`, expected one of `a`, `b`" → "unknown key `runn` (expected one
/// of `a`, `b`)".
fn reword_unknown(rest: &str) -> String {
    match rest.split_once(", ") {
        Some((key, expected)) => format!("unknown key {key} ({expected})"),
        None => format!("unknown key {rest}"),
    }
}

/// serde speaks Rust ("expected i64", "unknown variant"); the reader of a
/// config file speaks TOML.
fn plain_words(msg: &str) -> String {
    let mut out = [
        ("expected i64", "expected an integer"),
        ("expected i32", "expected an integer"),
        ("expected usize", "expected an integer"),
        ("expected f64", "expected a number"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected a table"),
        ("unknown variant", "unknown value"),
        ("invalid type: map", "invalid type: table"),
        ("floating point", "float"),
        (" as i128", ""),
    ]
    .iter()
    .fold(msg.to_string(), |m, (from, to)| m.replace(from, to));
    // Our internal struct names mean nothing in a config file.
    if let Some(i) = out.find("expected struct ") {
        let rest = &out[i + "expected struct ".len()..];
        let end = rest
            .find(|c: char| !c.is_alphanumeric() && c != '_')
            .unwrap_or(rest.len());
        out = format!("{}expected a table{}", &out[..i], &rest[end..]);
    }
    if out.starts_with("invalid type: integer") && out.ends_with("expected an integer") {
        return "integer out of range".to_string();
    }
    if out.contains("invalid type: table, expected an array") {
        out.push_str(" (a list of tables is written [[name]])");
    }
    out
}

fn backticked(s: &str) -> Option<&str> {
    s.strip_prefix('`')?.split('`').next()
}

#[derive(Debug, PartialEq)]
pub(super) enum Segment {
    /// A plain key or table name.
    Key(String),
    /// An element of `[[pipeline]]`, `[[pipeline.step]]` or `[[schedule]]`,
    /// named by its `name` key (or its position if it has none).
    Named {
        kind: String,
        name: Option<String>,
        index: usize,
    },
}

impl std::fmt::Display for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Segment::Key(k) => f.write_str(k),
            Segment::Named {
                kind,
                name: Some(n),
                ..
            } => write!(f, "{kind} {n:?}"),
            Segment::Named { kind, index, .. } => write!(f, "{kind} #{}", index + 1),
        }
    }
}

/// The keys leading to `offset`, outermost first.
pub(super) fn path_to(table: &DeTable<'_>, offset: usize) -> Vec<Segment> {
    let mut path = Vec::new();
    descend(table, offset, &mut path);
    path
}

fn descend(table: &DeTable<'_>, offset: usize, path: &mut Vec<Segment>) {
    for (key, value) in table.iter() {
        let name = key.get_ref().to_string();
        if contains(&key.span(), offset) {
            path.push(Segment::Key(name));
            return;
        }
        if !contains(&extent(value), offset) {
            continue;
        }
        match value.get_ref() {
            DeValue::Table(t) => {
                path.push(Segment::Key(name));
                descend(t, offset, path);
            }
            DeValue::Array(items) if items.iter().all(|v| v.get_ref().is_table()) => {
                let found = items
                    .iter()
                    .enumerate()
                    .find_map(|(index, v)| match v.get_ref() {
                        DeValue::Table(t) if contains(&extent(v), offset) => Some((index, t)),
                        _ => None,
                    });
                match found {
                    Some((index, t)) => {
                        path.push(Segment::Named {
                            kind: name,
                            name: name_of(t),
                            index,
                        });
                        descend(t, offset, path);
                    }
                    None => path.push(Segment::Key(name)),
                }
            }
            _ => path.push(Segment::Key(name)),
        }
        return;
    }
}

fn name_of(table: &DeTable<'_>) -> Option<String> {
    table
        .iter()
        .find(|(k, _)| k.get_ref() == "name")
        .and_then(|(_, v)| v.get_ref().as_str().map(str::to_string))
}

fn contains(r: &Range<usize>, offset: usize) -> bool {
    r.start <= offset && offset < r.end.max(r.start + 1)
}

/// The span of a value together with everything written under it.
fn extent(value: &Spanned<DeValue<'_>>) -> Range<usize> {
    let mut r = value.span();
    let mut widen = |o: Range<usize>| {
        r.start = r.start.min(o.start);
        r.end = r.end.max(o.end);
    };
    match value.get_ref() {
        DeValue::Table(t) => {
            for (k, v) in t.iter() {
                widen(k.span());
                widen(extent(v));
            }
        }
        DeValue::Array(items) => {
            for v in items.iter() {
                widen(extent(v));
            }
        }
        _ => {}
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_step_of_an_offset() {
        let text = "[workers]\nslots = 2\n\n[[pipeline]]\nname = \"a\"\n[[pipeline.step]]\nname = \"one\"\nbuiltin = \"noop\"\n\n[[pipeline]]\nname = \"b\"\n[[pipeline.step]]\nname = \"two\"\nrunn = []\n";
        let tree = parse_tree(text).unwrap();
        let at = text.find("runn").unwrap();
        let path: Vec<String> = path_to(tree.get_ref(), at)
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(path, ["pipeline \"b\"", "step \"two\"", "runn"]);
        let at = text.find("slots").unwrap();
        let path: Vec<String> = path_to(tree.get_ref(), at)
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(path, ["workers", "slots"]);
        assert_eq!(line_of(text, at), 2);
    }
}
