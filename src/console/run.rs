//! The live loop: terminal lifecycle, input events, background snapshots,
//! commands on tasks, and the quit/drain sequence. Drawing reads the last
//! snapshot from a watch channel and never awaits the database.

use std::io::stdout;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::Utc;
use futures::StreamExt;
use ratatui::crossterm::event::{
    DisableMouseCapture, EnableMouseCapture, Event, EventStream, KeyEventKind,
};
use ratatui::crossterm::execute;
use ratatui::layout::Rect;
use tokio::sync::{Notify, mpsc, watch};

use super::actions::{self, Ctx};
use super::catalog::Catalog;
use super::render::{self, Theme, View};
use super::snapshot::fetch::{FetchRequest, spawn_fetcher};
use super::state::{App, Flash};
use super::update::{Effect, on_key, on_mouse};
use crate::config::Config;
use crate::engine::{EngineHandle, EngineStatus};
use crate::store::Store;

pub struct ConsoleOptions {
    pub store: Store,
    /// This node's engine; `None` = `--no-workers` (watch only).
    pub engine: Option<EngineHandle>,
    pub config: Arc<Config>,
    /// How often the panes are refetched (500 ms by default).
    pub refresh: Duration,
    pub readonly: bool,
    pub node_id: String,
    /// What `q` gives this node's running jobs before stopping them (5 s).
    pub drain_grace: Duration,
}

/// Redraw at least this often, so clocks and countdowns move between
/// snapshots.
const TICK: Duration = Duration::from_millis(250);

/// Run the console until the operator quits. The terminal is restored on
/// return, on error and on panic.
pub async fn run(opts: ConsoleOptions) -> anyhow::Result<()> {
    let mut terminal = ratatui::init();
    // ratatui's hook restores raw mode and the screen; mouse capture is ours.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let _ = execute!(stdout(), DisableMouseCapture);
        hook(info);
    }));
    let result = match execute!(stdout(), EnableMouseCapture) {
        Ok(()) => Console::new(opts).run(&mut terminal).await,
        Err(e) => Err(e).context("cannot enable mouse capture"),
    };
    let _ = execute!(stdout(), DisableMouseCapture);
    ratatui::restore();
    result
}

/// Where the quit sequence stands.
enum Quitting {
    No,
    /// `q`: draining until the engine stops; `until` drives the countdown.
    Draining {
        until: Instant,
    },
    /// `Q`, or a drain cut short: the engine is stopping its steps.
    Stopping,
}

struct Console {
    opts: ConsoleOptions,
    app: App,
    catalog: Catalog,
    theme: Theme,
    ctx: Arc<Ctx>,
    db: String,
    quitting: Quitting,
}

impl Console {
    fn new(opts: ConsoleOptions) -> Console {
        let ctx = Arc::new(Ctx {
            store: opts.store.clone(),
            engine: opts.engine.clone(),
            actor: crate::job::operator_actor(),
            worker_alive: opts.config.workers.lease * 3,
            max_attempts: opts
                .config
                .pipelines
                .iter()
                .map(|p| (p.name.clone(), p.max_attempts))
                .collect(),
        });
        Console {
            app: App {
                engine: opts.engine.is_some(),
                ..App::new(opts.readonly)
            },
            catalog: Catalog::from_config(&opts.config),
            theme: Theme::from_env(),
            db: opts.store.display_url(),
            ctx,
            quitting: Quitting::No,
            opts,
        }
    }

    async fn run(mut self, terminal: &mut ratatui::DefaultTerminal) -> anyhow::Result<()> {
        let (req_tx, req_rx) = watch::channel(FetchRequest::default());
        let nudge = Arc::new(Notify::new());
        let (mut snaps, fetcher) = spawn_fetcher(
            self.opts.store.clone(),
            self.opts.refresh,
            req_rx,
            nudge.clone(),
        );
        let (flash_tx, mut flashes) = mpsc::unbounded_channel::<Flash>();
        let (stopped_tx, mut stopped) = mpsc::unbounded_channel::<()>();
        let mut engine_rx = self.opts.engine.as_ref().map(EngineHandle::subscribe);
        let mut events = EventStream::new();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);

        let result = loop {
            let snap = snaps.borrow().clone();
            let status = self.opts.engine.as_ref().map(EngineHandle::status);
            let size = terminal.size()?;
            let area = Rect::new(0, 0, size.width, size.height);
            terminal.draw(|f| self.draw(f, &snap, status.as_ref()))?;

            tokio::select! {
                ev = events.next() => match ev {
                    Some(Ok(Event::Key(key))) if key.kind == KeyEventKind::Press => {
                        let effect = on_key(&mut self.app, &key, &snap, &self.catalog);
                        self.effect(effect, &flash_tx, &stopped_tx);
                    }
                    Some(Ok(Event::Mouse(m))) => on_mouse(&mut self.app, &m, area, &snap),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break Err(anyhow::Error::new(e).context("terminal input failed")),
                    None => break Ok(()),
                },
                changed = snaps.changed() => match changed {
                    Ok(()) => self.app.follow(&snap, &snaps.borrow()),
                    Err(_) => break Err(anyhow::anyhow!("the snapshot task ended unexpectedly")),
                },
                Some(flash) = flashes.recv() => {
                    self.app.flash = Some(flash);
                    nudge.notify_one();
                }
                changed = changed_or_pending(&mut engine_rx) => if changed.is_err() {
                    // The engine has stopped: nothing more will change there.
                    engine_rx = None;
                },
                Some(()) = stopped.recv() => break Ok(()),
                _ = tick.tick() => {}
            }
            let req = FetchRequest {
                filter: Some(self.app.filter.clone()).filter(|f| !f.is_empty()),
                detail: self.app.detail,
            };
            req_tx.send_if_modified(|cur| {
                let changed = *cur != req;
                *cur = req;
                changed
            });
        };
        fetcher.abort();
        result
    }

    fn draw(
        &self,
        frame: &mut ratatui::Frame,
        snap: &super::Snapshot,
        status: Option<&EngineStatus>,
    ) {
        let drain_left = match self.quitting {
            Quitting::Draining { until } => Some(until.saturating_duration_since(Instant::now())),
            _ => None,
        };
        let view = View {
            app: &self.app,
            snap,
            engine: status,
            node_id: &self.opts.node_id,
            db: &self.db,
            catalog: &self.catalog,
            theme: self.theme,
            now: Utc::now() + snap.clock_skew,
            drain_left,
        };
        render::draw(frame, &view);
    }

    fn effect(
        &mut self,
        effect: Effect,
        flashes: &mpsc::UnboundedSender<Flash>,
        stopped: &mpsc::UnboundedSender<()>,
    ) {
        match effect {
            Effect::None => {}
            Effect::Run(cmd) => {
                let (ctx, tx) = (self.ctx.clone(), flashes.clone());
                tokio::spawn(async move {
                    let _ = tx.send(actions::execute(cmd, &ctx).await);
                });
            }
            Effect::Quit => {
                if !matches!(self.quitting, Quitting::No) {
                    return;
                }
                let Some(engine) = self.opts.engine.clone() else {
                    let _ = stopped.send(());
                    return;
                };
                let grace = self.opts.drain_grace;
                self.quitting = Quitting::Draining {
                    until: Instant::now() + grace,
                };
                self.app.draining = true;
                let tx = stopped.clone();
                tokio::spawn(async move {
                    engine.drain(grace).await;
                    let _ = tx.send(());
                });
            }
            Effect::QuitNow => {
                let Some(engine) = self.opts.engine.clone() else {
                    let _ = stopped.send(());
                    return;
                };
                if matches!(self.quitting, Quitting::Stopping) {
                    return;
                }
                self.quitting = Quitting::Stopping;
                self.app.draining = true;
                let tx = stopped.clone();
                tokio::spawn(async move {
                    engine.stop().await;
                    let _ = tx.send(());
                });
            }
        }
    }
}

/// Resolves when the engine's status changes; never, without an engine.
async fn changed_or_pending(
    rx: &mut Option<watch::Receiver<EngineStatus>>,
) -> Result<(), watch::error::RecvError> {
    match rx {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
    }
}
