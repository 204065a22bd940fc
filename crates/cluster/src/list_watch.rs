//! The list-then-watch loop every kept collection runs (the reconciler's pods of its node, the
//! lease service's records of a network): list, watch from the list's resourceVersion round after
//! round, list again when the watch cannot resume; after a failure wait, jittered and doubling,
//! before listing again. What is kept is stale from a failure or an expiry until the next list.

use std::time::{Duration, Instant};

use tether_kube_store::jittered;
use tether_kube_store::watching::WatchEnd;

/// How a watch round ended, as the loop needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// Watch again from this resourceVersion (an empty one: list again).
    From(String),
    /// List again (the watch expired, or what is kept must be read whole again).
    Relist,
}

impl From<WatchEnd> for Resume {
    /// A closed watch resumes where it stopped; an expired one cannot.
    fn from(end: WatchEnd) -> Resume {
        match end {
            WatchEnd::Closed { resource_version } => Resume::From(resource_version),
            WatchEnd::Expired => Resume::Relist,
        }
    }
}

/// How the loop names its collection and waits after a failure.
#[derive(Debug, Clone)]
pub struct ListWatch<'a> {
    /// The collection, for logs ("reconcile: pods (spec.nodeName=gpu-1)").
    pub what: &'a str,
    /// The first wait after a failure; doubled per failure up to [`ListWatch::max_wait`], reset
    /// when a watch round ends normally.
    pub first_wait: Duration,
    /// The longest wait.
    pub max_wait: Duration,
    /// The level of a failure's log line.
    pub level: log::Level,
}

impl ListWatch<'_> {
    /// Run until `keep_going()` turns false, or `list` gives up (`Ok(None)`: not to be kept).
    /// `list` reads the collection whole and returns the resourceVersion to watch from; `watch`
    /// runs one round from it; `stale` is called whenever what is kept stops being current (a
    /// failed list or watch, a watch that cannot resume), until the next list.
    pub fn run(
        &self,
        keep_going: &dyn Fn() -> bool,
        mut list: impl FnMut() -> Result<Option<String>, String>,
        mut watch: impl FnMut(&str) -> Result<Resume, String>,
        stale: impl Fn(),
    ) {
        let mut wait = self.first_wait;
        let failed = |wait: &mut Duration, why: String, then: &str| {
            stale();
            let w = jittered(*wait).min(self.max_wait);
            log::log!(
                self.level,
                "{}: {why}; {then} in {:.1}s",
                self.what,
                w.as_secs_f32()
            );
            let until = Instant::now() + w;
            while keep_going() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(100).min(w));
            }
            *wait = (*wait * 2).min(self.max_wait);
        };
        'relist: while keep_going() {
            let mut rv = match list() {
                Ok(Some(rv)) => rv,
                Ok(None) => return,
                Err(e) => {
                    failed(&mut wait, format!("listing: {e}"), "retrying");
                    continue;
                }
            };
            while keep_going() {
                match watch(&rv) {
                    Ok(Resume::From(next)) if !next.is_empty() => {
                        wait = self.first_wait;
                        rv = next;
                    }
                    // What happened meanwhile is unknown until the next list.
                    Ok(_) => {
                        stale();
                        log::info!("{}: the watch cannot resume; listing again", self.what);
                        continue 'relist;
                    }
                    Err(e) => {
                        failed(&mut wait, format!("watching: {e}"), "listing again");
                        continue 'relist;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn quick(what: &str) -> ListWatch<'_> {
        ListWatch {
            what,
            first_wait: Duration::from_millis(1),
            max_wait: Duration::from_millis(4),
            level: log::Level::Warn,
        }
    }

    #[test]
    fn lists_again_after_a_failure_or_an_expiry_and_resumes_from_each_rounds_version() {
        // What each call did, in order.
        let seen = RefCell::new(Vec::<String>::new());
        let lists = RefCell::new(0);
        let rounds = RefCell::new(0);
        let log = |s: String| seen.borrow_mut().push(s);
        quick("test").run(
            &|| *lists.borrow() < 5,
            || {
                *lists.borrow_mut() += 1;
                let n = *lists.borrow();
                log(format!("list {n}"));
                match n {
                    1 => Err("boom".into()),
                    _ => Ok(Some(format!("rv{n}"))),
                }
            },
            |rv| {
                *rounds.borrow_mut() += 1;
                log(format!("watch {rv}"));
                match (*lists.borrow(), rv) {
                    // Resumes once, then expires.
                    (2, "rv2") => Ok(Resume::From("rv2b".into())),
                    (2, _) => Ok(Resume::Relist),
                    // Closed with nowhere to resume from.
                    (3, _) => Ok(Resume::From(String::new())),
                    _ => Err("gone".into()),
                }
            },
            || log("stale".into()),
        );
        assert_eq!(
            *seen.borrow(),
            [
                "list 1",
                "stale",
                "list 2",
                "watch rv2",
                "watch rv2b",
                "stale",
                "list 3",
                "watch rv3",
                "stale",
                "list 4",
                "watch rv4",
                "stale",
                "list 5"
            ]
        );
    }

    #[test]
    fn a_list_that_gives_up_ends_the_loop() {
        let watched = RefCell::new(false);
        quick("test").run(
            &|| true,
            || Ok(None),
            |_| {
                *watched.borrow_mut() = true;
                Ok(Resume::Relist)
            },
            || {},
        );
        assert!(!*watched.borrow());
    }
}
