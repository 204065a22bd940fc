//! Injectable time source (unix seconds), so cooldown and quarantine are testable.

use std::time::{SystemTime, UNIX_EPOCH};

/// A source of "now" in unix seconds.
pub trait Clock {
    /// Current time, unix seconds.
    fn now(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }
}
