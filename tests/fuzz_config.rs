//! Fuzzing the config parser (proptest, bounded so CI stays fast): any
//! text, and mutations of the shipped valid configs, is either a config or
//! one line of error naming the file; never a panic.

use proptest::prelude::*;

const VALID: [&str; 2] = [
    include_str!("../assets/jobdeck.toml"),
    include_str!("../assets/demo.toml"),
];

/// Parses and checks the error's shape.
fn parse_ok_or_one_line(text: &str) {
    if let Err(e) = jobdeck::config::parse(text, "fuzz.toml") {
        let msg = e.to_string();
        assert!(!msg.contains('\n'), "a multi-line error: {msg:?}");
        assert!(msg.starts_with("fuzz.toml"), "the file is named: {msg:?}");
    }
}

/// One edit of a valid config: the kinds of mistake a person makes.
#[derive(Debug, Clone)]
enum Edit {
    Delete { at: usize, len: usize },
    Insert { at: usize, text: String },
    DuplicateLine { line: usize },
    DropLine { line: usize },
    ReplaceValue { line: usize, value: String },
}

fn edit() -> impl Strategy<Value = Edit> {
    let snippet = prop_oneof![
        Just("\"".to_string()),
        Just("[[pipeline]]\n".to_string()),
        Just("[[pipeline.step]]\n".to_string()),
        Just("[[schedule]]\n".to_string()),
        Just("= ".to_string()),
        Just("\n".to_string()),
        Just("'''".to_string()),
        Just("{target}".to_string()),
        Just("{arg.".to_string()),
        Just("-1".to_string()),
        Just("99999999999999999999".to_string()),
        "[ -~]{0,12}",
        any::<String>(),
    ];
    let value = prop_oneof![
        Just("\"-5s\"".to_string()),
        Just("\"\"".to_string()),
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("1e400".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("\"* * *\"".to_string()),
        Just("\"61 * * * * *\"".to_string()),
        Just("true".to_string()),
        Just("\"nope\"".to_string()),
        "\"[ -~]{0,10}\"",
    ];
    prop_oneof![
        (any::<usize>(), 1usize..40).prop_map(|(at, len)| Edit::Delete { at, len }),
        (any::<usize>(), snippet).prop_map(|(at, text)| Edit::Insert { at, text }),
        any::<usize>().prop_map(|line| Edit::DuplicateLine { line }),
        any::<usize>().prop_map(|line| Edit::DropLine { line }),
        (any::<usize>(), value).prop_map(|(line, value)| Edit::ReplaceValue { line, value }),
    ]
}

fn floor_char(text: &str, at: usize) -> usize {
    let mut at = at % (text.len() + 1);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn apply(text: &str, edit: &Edit) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    match edit {
        Edit::Delete { at, len } => {
            let a = floor_char(text, *at);
            let b = floor_char(text, (a + len).min(text.len()));
            format!("{}{}", &text[..a], &text[b.max(a)..])
        }
        Edit::Insert { at, text: ins } => {
            let a = floor_char(text, *at);
            format!("{}{ins}{}", &text[..a], &text[a..])
        }
        Edit::DuplicateLine { line } => {
            let i = line % lines.len().max(1);
            if let Some(l) = lines.get(i).cloned() {
                lines.insert(i, l);
            }
            lines.join("\n")
        }
        Edit::DropLine { line } => {
            if !lines.is_empty() {
                let i = line % lines.len();
                lines.remove(i);
            }
            lines.join("\n")
        }
        Edit::ReplaceValue { line, value } => {
            // Only lines with a value: `key = value`.
            let keyed: Vec<usize> = (0..lines.len())
                .filter(|i| !lines[*i].trim_start().starts_with('#') && lines[*i].contains(" = "))
                .collect();
            if !keyed.is_empty() {
                let i = keyed[line % keyed.len()];
                let key = lines[i].split(" = ").next().unwrap_or_default().to_string();
                lines[i] = format!("{key} = {value}");
            }
            lines.join("\n")
        }
    }
}

#[test]
fn shipped_configs_parse() {
    for text in VALID {
        jobdeck::config::parse(text, "fuzz.toml").expect("a shipped config parses");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text(text in any::<String>()) {
        parse_ok_or_one_line(&text);
    }

    #[test]
    fn toml_like_text(text in "([a-z_.\\[\\]]{1,12} ?= ?(\"[ -~]{0,8}\"|[0-9-]{1,4}|true|\\[\\]|\\{\\})?\n){0,12}") {
        parse_ok_or_one_line(&text);
    }

    #[test]
    fn mutated_valid_configs(which in 0usize..2, edits in prop::collection::vec(edit(), 1..4)) {
        let mut text = VALID[which].to_string();
        for e in &edits {
            text = apply(&text, e);
        }
        parse_ok_or_one_line(&text);
    }
}
