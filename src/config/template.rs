//! `{target}` and `{arg.NAME}` in a step's argv.
//!
//! Each argv item is filled in on its own and handed to the process as one
//! argument, never to a shell: a target or argument containing `;`, `$()` or
//! spaces stays one literal argument.

use std::collections::BTreeSet;

#[derive(Debug, PartialEq)]
enum Piece<'a> {
    Text(&'a str),
    Target,
    Arg(&'a str),
}

/// Split one argv item into text and placeholders. `{{` and `}}` stand for
/// literal braces.
fn pieces(item: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = item;
    while !rest.is_empty() {
        let Some(i) = rest.find(['{', '}']) else {
            out.push(Piece::Text(rest));
            break;
        };
        if i > 0 {
            out.push(Piece::Text(&rest[..i]));
        }
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("{{") {
            out.push(Piece::Text("{"));
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            out.push(Piece::Text("}"));
            rest = after;
        } else if tail.starts_with('}') {
            return Err(format!(
                "a lone `}}` in {item:?} (write `}}}}` for a literal brace)"
            ));
        } else {
            let Some(close) = tail.find('}') else {
                return Err(format!(
                    "an unclosed `{{` in {item:?} (write `{{{{` for a literal brace)"
                ));
            };
            let inner = &tail[1..close];
            out.push(placeholder(inner, item)?);
            rest = &tail[close + 1..];
        }
    }
    Ok(out)
}

fn placeholder<'a>(inner: &'a str, item: &str) -> Result<Piece<'a>, String> {
    if inner == "target" {
        return Ok(Piece::Target);
    }
    if let Some(name) = inner.strip_prefix("arg.")
        && !name.is_empty()
        && !name.contains('{')
    {
        return Ok(Piece::Arg(name));
    }
    Err(format!(
        "unknown placeholder `{{{inner}}}` in {item:?} (expected {{target}} or {{arg.NAME}}; \
         write `{{{{` for a literal brace)"
    ))
}

/// Check every item's placeholders; the message names the bad item.
pub(super) fn check(argv: &[String]) -> Result<(), String> {
    argv.iter().try_for_each(|item| pieces(item).map(drop))
}

/// Whether `{target}` is used, and the `{arg.NAME}` names used (items that
/// do not parse are skipped: loading has already refused them).
pub(super) fn placeholders(argv: &[String]) -> (bool, BTreeSet<String>) {
    let mut target = false;
    let mut args = BTreeSet::new();
    for piece in argv.iter().filter_map(|item| pieces(item).ok()).flatten() {
        match piece {
            Piece::Target => target = true,
            Piece::Arg(name) => {
                args.insert(name.to_string());
            }
            Piece::Text(_) => {}
        }
    }
    (target, args)
}

/// Fill `{target}` and `{arg.NAME}` into each argv item. A placeholder
/// without a value is an error naming it; string arguments go in as they
/// are, other JSON values as their JSON text.
pub fn substitute(
    argv: &[String],
    target: Option<&str>,
    args: &serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<String>, String> {
    argv.iter()
        .map(|item| {
            let mut out = String::with_capacity(item.len());
            for piece in pieces(item)? {
                match piece {
                    Piece::Text(t) => out.push_str(t),
                    Piece::Target => out.push_str(
                        target.ok_or("the command uses {target} but the job has no target")?,
                    ),
                    Piece::Arg(name) => match args.get(name) {
                        Some(serde_json::Value::String(s)) => out.push_str(s),
                        Some(v) => out.push_str(&v.to_string()),
                        None => {
                            return Err(format!(
                                "missing argument `{name}` (the command uses {{arg.{name}}})"
                            ));
                        }
                    },
                }
            }
            Ok(out)
        })
        .collect()
}
