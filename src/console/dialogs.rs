//! Modal overlays: help, a y/n confirmation, and small text forms (filter,
//! extend-by duration, enqueue). Each answers a key with what to do next;
//! the caller applies it.

use std::time::Duration;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::actions::{Command, EnqueueSpec};

#[derive(Debug, Clone, PartialEq)]
pub enum Overlay {
    Help,
    Confirm(Confirm),
    Input(Input),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Confirm {
    pub question: String,
    pub command: Command,
}

#[derive(Debug, Clone, PartialEq)]
pub enum InputKind {
    Filter,
    ExtendBy(Vec<i64>),
    Enqueue,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub label: &'static str,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub kind: InputKind,
    pub fields: Vec<Field>,
    pub focus: usize,
    /// Why the last Enter was refused; shown under the fields.
    pub error: Option<String>,
}

/// What a key did to a dialog.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Still open (text edited, focus moved, or input refused).
    Open,
    /// Closed without doing anything.
    Dismissed,
    /// Closed; run this.
    Run(Command),
    /// Closed; filter the panes by this text.
    SetFilter(String),
}

impl Input {
    pub fn filter(current: &str) -> Input {
        Input::new(InputKind::Filter, &[("filter", current)])
    }

    pub fn extend_by(ids: Vec<i64>) -> Input {
        Input::new(InputKind::ExtendBy(ids), &[("extend by", "")])
    }

    pub fn enqueue(pipeline: &str) -> Input {
        Input::new(
            InputKind::Enqueue,
            &[("pipeline", pipeline), ("target", ""), ("args", "")],
        )
    }

    fn new(kind: InputKind, fields: &[(&'static str, &str)]) -> Input {
        Input {
            kind,
            fields: fields
                .iter()
                .map(|(label, value)| Field {
                    label,
                    value: value.to_string(),
                })
                .collect(),
            focus: 0,
            error: None,
        }
    }

    pub fn title(&self) -> String {
        match &self.kind {
            InputKind::Filter => "Filter (id, pipeline, target)".into(),
            InputKind::ExtendBy(ids) => format!("Extend the lease of {}", job_list(ids)),
            InputKind::Enqueue => "Enqueue a job".into(),
        }
    }

    pub fn key(&mut self, key: &KeyEvent) -> Reply {
        if key.modifiers.contains(KeyModifiers::CONTROL) {
            return Reply::Open;
        }
        let n = self.fields.len();
        match key.code {
            KeyCode::Esc => return Reply::Dismissed,
            KeyCode::Enter => return self.submit(),
            KeyCode::Tab | KeyCode::Down => self.focus = (self.focus + 1) % n,
            KeyCode::BackTab | KeyCode::Up => self.focus = (self.focus + n - 1) % n,
            KeyCode::Backspace => {
                self.fields[self.focus].value.pop();
            }
            KeyCode::Char(c) => self.fields[self.focus].value.push(c),
            _ => {}
        }
        Reply::Open
    }

    fn submit(&mut self) -> Reply {
        match self.parse() {
            Ok(reply) => reply,
            Err(e) => {
                self.error = Some(e);
                Reply::Open
            }
        }
    }

    fn value(&self, i: usize) -> &str {
        self.fields[i].value.trim()
    }

    fn parse(&self) -> Result<Reply, String> {
        match &self.kind {
            InputKind::Filter => Ok(Reply::SetFilter(self.value(0).to_string())),
            InputKind::ExtendBy(ids) => {
                let by = parse_duration(self.value(0))?;
                Ok(Reply::Run(Command::Extend {
                    ids: ids.clone(),
                    by,
                }))
            }
            InputKind::Enqueue => {
                let pipeline = self.value(0);
                if pipeline.is_empty() {
                    return Err("a pipeline is required".into());
                }
                let target = Some(self.value(1).to_string()).filter(|t| !t.is_empty());
                Ok(Reply::Run(Command::Enqueue(EnqueueSpec {
                    pipeline: pipeline.to_string(),
                    target,
                    args: parse_args(self.value(2))?,
                })))
            }
        }
    }
}

/// "90s", "5m", "1h 30m" (humantime); refuses zero and nonsense.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    const EXAMPLES: &str = "(try 30s, 5m, 1h)";
    if text.is_empty() {
        return Err(format!("a duration is required {EXAMPLES}"));
    }
    // humantime's own wording ("expected number at 0", a list of every unit
    // it knows) overflows the dialog and names no fix: examples say more.
    let d = humantime::parse_duration(text)
        .map_err(|_| format!("{text:?} is not a duration {EXAMPLES}"))?;
    if d.is_zero() {
        return Err("the duration must be more than zero".into());
    }
    Ok(d)
}

/// Arguments as a JSON object (`{"days": 7}`) or `key=value` pairs
/// separated by spaces, values taken as JSON when they parse, else text.
pub fn parse_args(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    if text.is_empty() {
        return Ok(serde_json::Map::new());
    }
    if text.starts_with(['{', '[']) {
        return match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(m)) => Ok(m),
            Ok(_) => Err("args must be a JSON object".into()),
            Err(e) => Err(format!("args are not valid JSON: {e}")),
        };
    }
    let mut map = serde_json::Map::new();
    for pair in text.split_whitespace() {
        let (k, v) = pair
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| format!("{pair:?} is not key=value"))?;
        let value = serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.into()));
        map.insert(k.to_string(), value);
    }
    Ok(map)
}

impl Confirm {
    pub fn key(&self, key: &KeyEvent) -> Reply {
        match key.code {
            KeyCode::Char('y' | 'Y') | KeyCode::Enter => Reply::Run(self.command.clone()),
            KeyCode::Char('n' | 'N') | KeyCode::Esc | KeyCode::Char('q') => Reply::Dismissed,
            _ => Reply::Open,
        }
    }
}

/// "job 42" or "3 jobs (#1, #2, #3)".
pub fn job_list(ids: &[i64]) -> String {
    match ids {
        [id] => format!("job {id}"),
        _ => {
            let shown: Vec<String> = ids.iter().take(5).map(|i| format!("#{i}")).collect();
            let more = if ids.len() > 5 { ", …" } else { "" };
            format!("{} jobs ({}{more})", ids.len(), shown.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(input: &mut Input, text: &str) {
        for c in text.chars() {
            input.key(&KeyEvent::from(KeyCode::Char(c)));
        }
    }

    #[test]
    fn extend_by_parses_humantime_and_refuses_nonsense() {
        let mut i = Input::extend_by(vec![7]);
        press(&mut i, "soon");
        assert_eq!(i.key(&KeyEvent::from(KeyCode::Enter)), Reply::Open);
        assert!(i.error.as_deref().unwrap().contains("not a duration"));
        for _ in 0..4 {
            i.key(&KeyEvent::from(KeyCode::Backspace));
        }
        press(&mut i, "2m");
        assert_eq!(
            i.key(&KeyEvent::from(KeyCode::Enter)),
            Reply::Run(Command::Extend {
                ids: vec![7],
                by: Duration::from_secs(120)
            })
        );
    }

    #[test]
    fn a_bad_duration_is_named_in_one_line_with_examples() {
        let refused = |text: &str| {
            let mut i = Input::extend_by(vec![7]);
            press(&mut i, text);
            assert_eq!(i.key(&KeyEvent::from(KeyCode::Enter)), Reply::Open);
            i.error.expect("an error under the field")
        };
        assert_eq!(
            refused("10x"),
            r#""10x" is not a duration (try 30s, 5m, 1h)"#
        );
        assert_eq!(
            refused("-5s"),
            r#""-5s" is not a duration (try 30s, 5m, 1h)"#
        );
        assert_eq!(refused("  "), "a duration is required (try 30s, 5m, 1h)");
        assert_eq!(refused("0s"), "the duration must be more than zero");
    }

    #[test]
    fn enqueue_reads_three_fields() {
        let mut i = Input::enqueue("");
        assert_eq!(i.key(&KeyEvent::from(KeyCode::Enter)), Reply::Open);
        assert_eq!(i.error.as_deref(), Some("a pipeline is required"));
        press(&mut i, "sync");
        i.key(&KeyEvent::from(KeyCode::Tab));
        press(&mut i, "dataset-a");
        i.key(&KeyEvent::from(KeyCode::Tab));
        press(&mut i, "days=7 mode=full");
        let Reply::Run(Command::Enqueue(spec)) = i.key(&KeyEvent::from(KeyCode::Enter)) else {
            panic!("expected an enqueue");
        };
        assert_eq!(spec.pipeline, "sync");
        assert_eq!(spec.target.as_deref(), Some("dataset-a"));
        assert_eq!(spec.args["days"], serde_json::json!(7));
        assert_eq!(spec.args["mode"], serde_json::json!("full"));
    }

    #[test]
    fn args_refuse_bad_input_with_a_reason() {
        assert!(parse_args("[1]").unwrap_err().contains("JSON object"));
        assert!(parse_args("{oops").unwrap_err().contains("not valid JSON"));
        assert!(parse_args("=x").unwrap_err().contains("key=value"));
        assert_eq!(parse_args(r#"{"a":1}"#).unwrap()["a"], serde_json::json!(1));
    }
}
