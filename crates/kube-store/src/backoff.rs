//! Waits spread over time: many clients that failed together (every agent against one restarted
//! API server) must not come back in step.

use std::time::Duration;

/// `d` times a random factor in [0.5, 1.5).
pub fn jittered(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded randomly per process (and per instance): enough to spread them.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    d.mul_f64(0.5 + (r % 1000) as f64 / 1000.0)
}
