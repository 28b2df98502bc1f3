//! What the console knows about pipelines from the configuration: step
//! names (to show "step 2/4 verify" for jobs of every node) and lease
//! lengths (to colour a lease running out, and for `e`).

use std::collections::BTreeMap;
use std::time::Duration;

/// Default lease when a pipeline is unknown to this node's configuration.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq)]
pub struct PipelineInfo {
    pub steps: Vec<String>,
    pub lease: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Catalog {
    pub pipelines: BTreeMap<String, PipelineInfo>,
    /// A worker without a heartbeat for this long is treated as gone: its
    /// jobs' leases are not extended.
    pub worker_alive: Duration,
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog {
            pipelines: BTreeMap::new(),
            worker_alive: DEFAULT_LEASE,
        }
    }
}

impl Catalog {
    pub fn lease(&self, pipeline: &str) -> Duration {
        self.pipelines
            .get(pipeline)
            .map_or(DEFAULT_LEASE, |p| p.lease)
    }

    /// "2/4 verify" for 0-based `step`; "4/4 done" once a job has passed its
    /// last step (a succeeded job's step is the number of steps); "3" when
    /// the pipeline is unknown here.
    pub fn step_label(&self, pipeline: &str, step: i32) -> String {
        match self.pipelines.get(pipeline) {
            Some(p) if usize::try_from(step).is_ok_and(|i| i >= p.steps.len()) => {
                format!("{n}/{n} done", n = p.steps.len())
            }
            Some(p) => {
                let name = usize::try_from(step)
                    .ok()
                    .and_then(|i| p.steps.get(i))
                    .map_or("?", String::as_str);
                format!("{}/{} {name}", step + 1, p.steps.len())
            }
            None => format!("{}", step + 1),
        }
    }

    /// The name of the step a job stopped at (for stale rows).
    pub fn step_name(&self, pipeline: &str, step: i32) -> Option<&str> {
        let p = self.pipelines.get(pipeline)?;
        p.steps.get(usize::try_from(step).ok()?).map(String::as_str)
    }
}

impl Catalog {
    /// Step names and leases from this node's configuration. A worker is
    /// alive while it has beaten within three leases, the reaper's own
    /// threshold for calling it gone.
    pub fn from_config(config: &crate::config::Config) -> Catalog {
        let lease = config.workers.lease;
        Catalog {
            pipelines: config
                .pipelines
                .iter()
                .map(|p| {
                    let steps = p.steps.iter().map(|s| s.name.clone()).collect();
                    (p.name.clone(), PipelineInfo { steps, lease })
                })
                .collect(),
            worker_alive: lease * 3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_labels() {
        let mut c = Catalog::default();
        c.pipelines.insert(
            "p".into(),
            PipelineInfo {
                steps: vec!["sync".into(), "verify".into()],
                lease: DEFAULT_LEASE,
            },
        );
        assert_eq!(c.step_label("p", 0), "1/2 sync");
        assert_eq!(c.step_label("p", 1), "2/2 verify");
        // Every step done: not "3/2 ?".
        assert_eq!(c.step_label("p", 2), "2/2 done");
        assert_eq!(c.step_label("other", 4), "5");
    }
}
