//! Who is in the fleet, from what the platform already knows: a fixed list, a file (a mounted
//! ConfigMap, say) re-read at every refresh, or the DNS name of a Kubernetes headless Service,
//! whose answer lists the ready replicas. No gossip or consensus of our own.
//!
//! Every refresh, each member listed is asked `/v1/info`: that tells its zone, checks that it
//! cuts blocks the same way, and finds which listed name is this replica (its own id comes
//! back). A member that fails [`DOWN_AFTER`] probes in a row owns nothing until it answers
//! again; one that has never answered owns nothing yet.
//!
//! A listing that fails, or that names no one at all, leaves the view as it was. Every member
//! list names each replica itself, so an empty one is never a fleet: it is a file caught between
//! its truncation and its writing, or a DNS answer with no ready replica for a moment. Taking it
//! as one would leave every replica caching alone for a refresh, then move every block back.
//! To shrink a fleet, the list names the replicas that stay: the others stop asking the rest.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio_util::sync::CancellationToken;

use super::client::Info;
use super::ring::{Member, Scope, View};
use super::{Absent, Fleet};

/// Probes a member may fail in a row before it stops owning blocks.
pub const DOWN_AFTER: u32 = 2;

/// Where the member list comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberSource {
    /// These `host:port` names.
    Static(Vec<String>),
    /// A file of `host:port` names (whitespace or comma separated, `#` comments), re-read at
    /// each refresh.
    File(PathBuf),
    /// Every address a DNS name resolves to, each with the name's port (`name:port`).
    Dns(String),
}

impl MemberSource {
    /// The member names right now; an error when the source cannot be read, or names no one
    /// (never a fleet: see the module documentation).
    pub async fn names(&self) -> std::io::Result<Vec<String>> {
        let mut names = match self {
            MemberSource::Static(list) => list.clone(),
            MemberSource::File(path) => parse_list(&tokio::fs::read_to_string(path).await?),
            MemberSource::Dns(name) => tokio::net::lookup_host(name.as_str())
                .await?
                .map(|a| a.to_string())
                .collect(),
        };
        if names.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the member list names no one",
            ));
        }
        names.sort();
        names.dedup();
        Ok(names)
    }
}

/// Names in a list: separated by whitespace or commas, `#` starting a comment.
pub fn parse_list(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or(""))
        .flat_map(|line| line.split(|c: char| c == ',' || c.is_whitespace()))
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

#[derive(Debug)]
struct Probe {
    zone: Option<String>,
    up: bool,
    failures: u32,
    /// Why the last probe did not admit it.
    error: Option<String>,
}

/// Keeps a [`Fleet`]'s view in step with its member source.
pub struct Membership {
    fleet: Arc<Fleet>,
    source: MemberSource,
    me: Info,
    advertise: String,
    scope: Scope,
    refresh: Duration,
    probes: HashMap<String, Probe>,
    /// The listed name that answered with this replica's id.
    self_name: Option<String>,
}

impl Membership {
    /// Membership of `fleet` from `source`, refreshed every `refresh`. This replica is `me`,
    /// called `advertise` until a listed name turns out to be itself.
    pub fn new(
        fleet: Arc<Fleet>,
        source: MemberSource,
        me: Info,
        advertise: String,
        scope: Scope,
        refresh: Duration,
    ) -> Self {
        Self {
            fleet,
            source,
            me,
            advertise,
            scope,
            refresh,
            probes: HashMap::new(),
            self_name: None,
        }
    }

    /// Refresh until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            self.refresh().await;
            tokio::select! {
                () = tokio::time::sleep(self.refresh) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Read the source, probe every member, and hand the fleet the new view.
    pub async fn refresh(&mut self) {
        let names = match self.source.names().await {
            Ok(names) => names,
            Err(e) => {
                // Keep the view we have: a flaky source, or a list caught empty, must not
                // empty the fleet.
                tracing::warn!(source = ?self.source, error = %e, "fleet members could not be listed");
                return;
            }
        };
        let client = self.fleet.client();
        let answers = join_all(names.iter().map(|name| client.info(name))).await;
        self.probes.retain(|name, _| names.contains(name));
        for (name, answer) in names.into_iter().zip(answers) {
            match answer {
                Ok(info) if info.id == self.me.id => {
                    self.probes.remove(&name);
                    self.self_name = Some(name);
                }
                Ok(info) if info.block_size != self.me.block_size => {
                    tracing::warn!(member = %name, block_size = info.block_size, "a fleet member cuts blocks of another size; not sharing with it");
                    let error = format!(
                        "cuts blocks of {} bytes, this replica of {}",
                        info.block_size, self.me.block_size
                    );
                    self.probes.insert(
                        name,
                        Probe {
                            zone: info.zone,
                            up: false,
                            failures: DOWN_AFTER,
                            error: Some(error),
                        },
                    );
                }
                Ok(info) => {
                    self.probes.insert(
                        name,
                        Probe {
                            zone: info.zone,
                            up: true,
                            failures: 0,
                            error: None,
                        },
                    );
                }
                Err(e) => {
                    let probe = self.probes.entry(name.clone()).or_insert(Probe {
                        zone: None,
                        up: false,
                        failures: 0,
                        error: None,
                    });
                    probe.failures += 1;
                    probe.error = Some(e.to_string());
                    if probe.up && probe.failures >= DOWN_AFTER {
                        tracing::warn!(member = %name, error = %e, "fleet member stopped answering");
                        probe.up = false;
                    } else if !probe.up && probe.failures == DOWN_AFTER + 1 {
                        // Once a streak: a member listed but never reached (wrong secret, port
                        // blocked, another block size) leaves this replica caching alone.
                        tracing::warn!(member = %name, error = %e, "fleet member listed but not answering");
                    }
                }
            }
        }
        let me = Member::new(
            self.self_name.as_deref().unwrap_or(&self.advertise),
            self.me.zone.as_deref(),
        );
        let others = self
            .probes
            .iter()
            .filter(|(_, p)| p.up)
            .map(|(name, p)| Member::new(name, p.zone.as_deref()));
        self.fleet.update(View::new(me, others, self.scope));
        let mut absent: Vec<Absent> = self
            .probes
            .iter()
            .filter(|(_, p)| !p.up)
            .map(|(name, p)| Absent {
                name: name.clone(),
                error: p.error.clone().unwrap_or_default(),
            })
            .collect();
        absent.sort_by(|a, b| a.name.cmp(&b.name));
        self.fleet.set_absent(absent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_with_commas_spaces_and_comments() {
        let text = "# peers\n10.0.0.1:9002, 10.0.0.2:9002\n\n  10.0.0.3:9002 # the third\n,";
        assert_eq!(
            parse_list(text),
            ["10.0.0.1:9002", "10.0.0.2:9002", "10.0.0.3:9002"]
        );
    }

    #[tokio::test]
    async fn sources_list_sorted_unique_names() {
        let list = MemberSource::Static(vec!["b:1".into(), "a:1".into(), "b:1".into()]);
        assert_eq!(list.names().await.unwrap(), ["a:1", "b:1"]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peers");
        std::fs::write(&path, "c:1\na:1").unwrap();
        let file = MemberSource::File(path.clone());
        assert_eq!(file.names().await.unwrap(), ["a:1", "c:1"]);
        std::fs::write(&path, "c:1 d:1").unwrap();
        assert_eq!(file.names().await.unwrap(), ["c:1", "d:1"], "re-read");
        let dns = MemberSource::Dns("127.0.0.1:9002".into());
        assert_eq!(dns.names().await.unwrap(), ["127.0.0.1:9002"]);
        assert!(MemberSource::File(dir.path().join("missing"))
            .names()
            .await
            .is_err());
        for listing in ["", "# rewritten\n\n , "] {
            std::fs::write(&path, listing).unwrap();
            assert!(file.names().await.is_err(), "{listing:?} names no one");
        }
    }
}
