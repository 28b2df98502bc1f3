//! A step's output: bounded line splitting, the shared tail the console
//! shows, checkpoint lines and the per-job log file.
//!
//! Steps are arbitrary programs: a line may be a megabyte long, never end, or
//! not be text at all. Every buffer here has a cap so that no output can
//! make the worker grow without bound.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Lines kept by [`OutputTail`].
pub const TAIL_LINES: usize = 200;
/// Longest line kept in the tail, in bytes (longer ones are cut, marked).
pub const TAIL_LINE_MAX: usize = 2048;
/// Longest line written to the log file; the rest of it is dropped, marked.
pub const LOG_LINE_MAX: usize = 64 * 1024;

/// The last [`TAIL_LINES`] lines of a step's output. Cheap to clone; all
/// clones share the same lines.
#[derive(Debug, Clone, Default)]
pub struct OutputTail {
    inner: Arc<Mutex<TailInner>>,
}

#[derive(Debug, Default)]
struct TailInner {
    lines: VecDeque<String>,
    version: u64,
}

impl OutputTail {
    pub fn new() -> OutputTail {
        OutputTail::default()
    }

    /// Appends one line (cut to [`TAIL_LINE_MAX`] bytes), dropping the oldest
    /// beyond [`TAIL_LINES`].
    pub fn push_line(&self, line: impl AsRef<str>) {
        self.push(cut(line.as_ref(), TAIL_LINE_MAX, 0));
    }

    fn push(&self, line: String) {
        let mut inner = self.lock();
        if inner.lines.len() == TAIL_LINES {
            inner.lines.pop_front();
        }
        inner.lines.push_back(line);
        inner.version += 1;
    }

    pub fn lines(&self) -> Vec<String> {
        self.lock().lines.iter().cloned().collect()
    }

    /// The lines joined by newlines.
    pub fn text(&self) -> String {
        let inner = self.lock();
        let mut text = String::new();
        for (i, line) in inner.lines.iter().enumerate() {
            if i > 0 {
                text.push('\n');
            }
            text.push_str(line);
        }
        text
    }

    /// Grows by one with every line pushed, so a saver can skip unchanged
    /// tails.
    pub fn version(&self) -> u64 {
        self.lock().version
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TailInner> {
        // A panic while holding this lock cannot leave the deque broken, so
        // a poisoned lock is still good to use.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `line` cut to at most `max` bytes (on a char boundary), with a marker
/// saying how much is missing; `dropped` bytes were already cut upstream.
fn cut(line: &str, max: usize, dropped: usize) -> String {
    if line.len() <= max && dropped == 0 {
        return line.to_string();
    }
    let mut end = line.len().min(max);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    let missing = line.len() - end + dropped;
    format!("{} …[{missing} more bytes]", &line[..end])
}

/// One line of output as read: at most [`LOG_LINE_MAX`] bytes kept.
#[derive(Debug, Clone, PartialEq)]
pub struct RawLine {
    pub bytes: Vec<u8>,
    /// Bytes of this line beyond the cap that were not kept.
    pub dropped: usize,
}

/// Reads `input` to its end, sending each line (without `\n` or `\r\n`).
/// Memory stays bounded however long a line is.
pub async fn split_lines<R: AsyncRead + Unpin>(mut input: R, out: mpsc::Sender<RawLine>) {
    let mut buf = vec![0u8; 8192];
    let mut line = RawLine {
        bytes: Vec::new(),
        dropped: 0,
    };
    let mut pending = false;
    loop {
        let n = match input.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            let (piece, newline) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            let room = LOG_LINE_MAX - line.bytes.len();
            let keep = piece.len().min(room);
            line.bytes.extend_from_slice(&piece[..keep]);
            line.dropped += piece.len() - keep;
            pending = true;
            rest = &rest[piece.len() + usize::from(newline)..];
            if newline {
                let done = std::mem::replace(
                    &mut line,
                    RawLine {
                        bytes: Vec::new(),
                        dropped: 0,
                    },
                );
                pending = false;
                if out.send(finish(done)).await.is_err() {
                    return;
                }
            }
        }
    }
    if pending {
        let _ = out.send(finish(line)).await;
    }
}

fn finish(mut line: RawLine) -> RawLine {
    if line.dropped == 0 && line.bytes.last() == Some(&b'\r') {
        line.bytes.pop();
    }
    line
}

/// Where lines go: the log file, the tail, and the checkpoint list.
pub struct Sink {
    pub log: tokio::io::BufWriter<tokio::fs::File>,
    pub tail: OutputTail,
    pub checkpoints: Vec<(String, String)>,
}

impl Sink {
    /// Consumes lines until every sender is gone; returns the checkpoints
    /// (one per key, the last value printed wins).
    pub async fn run(mut self, mut lines: mpsc::Receiver<RawLine>) -> Vec<(String, String)> {
        while let Some(line) = lines.recv().await {
            self.take(line).await;
            // Flush when idle, not per line: a chatty step should not cost a
            // write syscall per line, yet a quiet one is visible at once.
            if lines.is_empty() {
                let _ = self.log.flush().await;
            }
        }
        let _ = self.log.flush().await;
        self.checkpoints
    }

    async fn take(&mut self, line: RawLine) {
        // The log keeps the step's bytes as they were; a failing disk must
        // not fail the step, so write errors are ignored here.
        let _ = self.log.write_all(&line.bytes).await;
        if line.dropped > 0 {
            let _ = self
                .log
                .write_all(format!(" …[{} more bytes]", line.dropped).as_bytes())
                .await;
        }
        let _ = self.log.write_all(b"\n").await;
        let text = String::from_utf8_lossy(&line.bytes);
        if line.dropped == 0
            && let Some((key, value)) = parse_checkpoint(&text)
        {
            match self.checkpoints.iter_mut().find(|(k, _)| k == key) {
                Some(slot) => slot.1 = value.to_string(),
                None => self.checkpoints.push((key.to_string(), value.to_string())),
            }
        }
        self.tail.push(cut(&text, TAIL_LINE_MAX, line.dropped));
    }
}

/// `::jobdeck checkpoint KEY=VALUE` → (KEY, VALUE), KEY of `[A-Za-z0-9_]+`.
pub fn parse_checkpoint(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_prefix("::jobdeck checkpoint ")?;
    let (key, value) = rest.split_once('=')?;
    let valid = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    valid.then_some((key, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_lines() {
        assert_eq!(
            parse_checkpoint("::jobdeck checkpoint last_id=42"),
            Some(("last_id", "42"))
        );
        assert_eq!(
            parse_checkpoint("::jobdeck checkpoint K=a=b"),
            Some(("K", "a=b"))
        );
        assert_eq!(parse_checkpoint("::jobdeck checkpoint K="), Some(("K", "")));
        assert_eq!(parse_checkpoint("::jobdeck checkpoint bad-key=1"), None);
        assert_eq!(parse_checkpoint("::jobdeck checkpoint =1"), None);
        assert_eq!(parse_checkpoint(" ::jobdeck checkpoint a=1"), None);
        assert_eq!(parse_checkpoint("::jobdeck checkpoint noequals"), None);
    }

    #[test]
    fn tail_is_bounded_and_versioned() {
        let tail = OutputTail::new();
        assert_eq!(tail.version(), 0);
        for i in 0..250 {
            tail.push_line(format!("line {i}"));
        }
        let lines = tail.lines();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines[0], "line 50");
        assert_eq!(tail.version(), 250);
        assert!(tail.text().ends_with("line 248\nline 249"));
    }

    #[test]
    fn long_lines_are_cut_on_char_boundaries() {
        let tail = OutputTail::new();
        tail.push_line("é".repeat(TAIL_LINE_MAX));
        let line = &tail.lines()[0];
        assert!(line.len() <= TAIL_LINE_MAX + 32, "{}", line.len());
        assert!(line.ends_with(&format!(" …[{} more bytes]", TAIL_LINE_MAX)));
    }

    #[tokio::test]
    async fn split_lines_caps_and_strips() {
        let mut input = b"a\r\nb\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', LOG_LINE_MAX + 10));
        let (tx, mut rx) = mpsc::channel(10);
        split_lines(&input[..], tx).await;
        assert_eq!(rx.recv().await.unwrap().bytes, b"a");
        assert_eq!(rx.recv().await.unwrap().bytes, b"b");
        let long = rx.recv().await.unwrap();
        assert_eq!((long.bytes.len(), long.dropped), (LOG_LINE_MAX, 10));
        assert!(rx.recv().await.is_none());
    }
}
