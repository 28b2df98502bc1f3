//! Colours per state and role. With `NO_COLOR` set every colour is dropped
//! and only bold/reverse remain, so focus and selection still show.

use ratatui::style::{Color, Modifier, Style};

use crate::job::State;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Theme {
    pub color: bool,
}

impl Theme {
    /// Colour unless `NO_COLOR` is set to a non-empty value (no-color.org).
    pub fn from_env() -> Theme {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Theme { color: !no_color }
    }

    pub fn fg(&self, c: Color) -> Style {
        if self.color {
            Style::new().fg(c)
        } else {
            Style::new()
        }
    }

    pub fn state(&self, s: State) -> Style {
        self.fg(match s {
            State::Queued => Color::Blue,
            State::Leased => Color::Magenta,
            State::Running => Color::Green,
            State::Stale => Color::Red,
            State::Succeeded => Color::Green,
            State::Failed => Color::Red,
            State::Cancelled => Color::Yellow,
        })
    }

    pub fn warn(&self) -> Style {
        self.fg(Color::Yellow)
    }

    pub fn bad(&self) -> Style {
        self.fg(Color::Red)
    }

    pub fn good(&self) -> Style {
        self.fg(Color::Green)
    }

    pub fn dim(&self) -> Style {
        self.fg(Color::DarkGray)
    }

    pub fn key(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    pub fn title(&self, focused: bool) -> Style {
        if focused {
            self.fg(Color::Cyan)
                .add_modifier(Modifier::BOLD | Modifier::REVERSED)
        } else {
            Style::new().add_modifier(Modifier::BOLD)
        }
    }

    pub fn border(&self, focused: bool) -> Style {
        if focused {
            self.fg(Color::Cyan)
        } else {
            self.dim()
        }
    }

    pub fn selected(&self) -> Style {
        Style::new().add_modifier(Modifier::REVERSED)
    }

    pub fn marked(&self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }
}
