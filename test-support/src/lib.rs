//! What the workspace's tests share: [`eventually`], the one way a test waits for something
//! to happen.
//!
//! Tests run real processes on shared, sometimes slow machines, so a wait has a generous
//! deadline and says, when it runs out, what it was waiting for and what it saw last — a
//! failure names the condition, not a line number in a polling loop. Nothing is asserted
//! about how long a wait took (speed is measured by `fleetwatch bench`).
//!
//! ```
//! # async fn demo() {
//! use fleetwatch_test_support::eventually;
//! let mut n = 0;
//! let seen = eventually("the counter to reach 3")
//!     .until(async || { n += 1; n }, |n| *n >= 3)
//!     .await;
//! assert_eq!(seen, 3);
//! # }
//! ```
//!
//! A check that something does *not* happen cannot be a wait: it needs an event that proves
//! the system looked (a reconcile that started after the change finished, a counter moved)
//! and then asserts the state. Tests do that with [`eventually`] on that event, not with a
//! fixed sleep.

use std::fmt::{Debug, Display};
use std::time::{Duration, Instant};

/// How long a wait lasts unless [`Eventually::within`] says otherwise: generous, because a
/// loaded CI machine runs several test processes per core.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The first pause between two looks; it doubles up to [`MAX_PAUSE`], so a condition that
/// holds quickly is seen quickly and a slow one is not hammered.
const FIRST_PAUSE: Duration = Duration::from_millis(10);

/// The longest pause between two looks.
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// Starts a wait for `what` (said in the failure message: "the hub to list 3 clusters").
pub fn eventually(what: impl Display) -> Eventually<'static> {
    Eventually { what: what.to_string(), within: DEADLINE, pauses: Pauses::default(), context: None }
}

/// A wait being set up by [`eventually`]; ends with [`Eventually::until`] (async) or
/// [`Eventually::until_blocking`] (a plain thread).
#[must_use = "a wait does nothing until `until` or `until_blocking`"]
pub struct Eventually<'a> {
    what: String,
    within: Duration,
    pauses: Pauses,
    context: Option<Box<dyn Fn() -> String + 'a>>,
}

impl<'a> Eventually<'a> {
    /// Waits at most `within` instead of [`DEADLINE`] (for waits that must end before
    /// something else times out, or long ones such as a cluster forming).
    pub fn within(mut self, within: Duration) -> Self {
        self.within = within;
        self
    }

    /// Looks every `pause` instead of backing off: for a test that measures when the
    /// condition became true (a latency printed, never asserted) and must see it promptly.
    pub fn every(mut self, pause: Duration) -> Self {
        self.pauses = Pauses { first: pause, max: pause };
        self
    }

    /// Adds `context()` to the failure message, read when the wait fails (a process's log).
    pub fn context<'b>(self, context: impl Fn() -> String + 'b) -> Eventually<'b> {
        Eventually { what: self.what, within: self.within, pauses: self.pauses, context: Some(Box::new(context)) }
    }

    /// Looks with `observe` until `done` holds for what it saw, and returns that; panics
    /// at the deadline naming what was awaited and the last value seen.
    pub async fn until<O: Debug>(self, observe: impl AsyncFnMut() -> O, done: impl FnMut(&O) -> bool) -> O {
        match poll(self.within, self.pauses, observe, done).await {
            Ok(seen) => seen,
            Err(seen) => self.fail(&seen),
        }
    }

    /// [`Eventually::until`] for a plain thread (blocking `observe`, no async runtime).
    pub fn until_blocking<O: Debug>(self, observe: impl FnMut() -> O, done: impl FnMut(&O) -> bool) -> O {
        match poll_blocking(self.within, self.pauses, observe, done) {
            Ok(seen) => seen,
            Err(seen) => self.fail(&seen),
        }
    }

    fn fail(&self, seen: &dyn Debug) -> ! {
        let context = self.context.as_ref().map(|c| format!("\n{}", c())).unwrap_or_default();
        panic!("timed out after {:?} waiting for {}; last seen: {seen:#?}{context}", self.within, self.what)
    }
}

/// Whether `cond` becomes true within `within`: the form of [`eventually`] for a caller that
/// asserts with a message of its own (built from state only it holds) or acts on the outcome.
pub async fn holds_within(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    poll(within, Pauses::default(), async || cond(), |held| *held).await.is_ok()
}

/// [`holds_within`] for a plain thread.
pub fn holds_within_blocking(within: Duration, cond: impl FnMut() -> bool) -> bool {
    poll_blocking(within, Pauses::default(), cond, |held| *held).is_ok()
}

/// The pauses between two looks: `first`, doubling up to `max`.
#[derive(Clone, Copy)]
struct Pauses {
    first: Duration,
    max: Duration,
}

impl Default for Pauses {
    fn default() -> Self {
        Self { first: FIRST_PAUSE, max: MAX_PAUSE }
    }
}

/// Looks until `done` holds (`Ok`, what was seen) or `within` has passed (`Err`, what was
/// seen last), pausing between looks as `pauses` says.
async fn poll<O>(
    within: Duration,
    pauses: Pauses,
    mut observe: impl AsyncFnMut() -> O,
    mut done: impl FnMut(&O) -> bool,
) -> Result<O, O> {
    let start = Instant::now();
    let mut pause = pauses.first;
    loop {
        let seen = observe().await;
        if done(&seen) {
            return Ok(seen);
        }
        if start.elapsed() >= within {
            return Err(seen);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(pauses.max);
    }
}

/// [`poll`] on a plain thread.
fn poll_blocking<O>(
    within: Duration,
    pauses: Pauses,
    mut observe: impl FnMut() -> O,
    mut done: impl FnMut(&O) -> bool,
) -> Result<O, O> {
    let start = Instant::now();
    let mut pause = pauses.first;
    loop {
        let seen = observe();
        if done(&seen) {
            return Ok(seen);
        }
        if start.elapsed() >= within {
            return Err(seen);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(pauses.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_value_that_satisfies_the_condition() {
        let mut n = 0;
        let seen = eventually("n to reach 3")
            .until(
                async || {
                    n += 1;
                    n
                },
                |n| *n >= 3,
            )
            .await;
        assert_eq!(seen, 3);
    }

    #[test]
    fn the_failure_names_what_was_awaited_the_last_value_and_the_context() {
        let panic = std::panic::catch_unwind(|| {
            eventually("the impossible")
                .within(Duration::from_millis(30))
                .context(|| "log: nothing here".to_string())
                .until_blocking(|| 41, |n| *n == 42)
        })
        .unwrap_err();
        let message = panic.downcast_ref::<String>().unwrap();
        assert!(message.contains("waiting for the impossible; last seen: 41"), "{message}");
        assert!(message.contains("log: nothing here"), "{message}");
    }

    #[tokio::test]
    async fn holds_within_says_whether_the_condition_came_true() {
        let mut n = 0;
        assert!(
            holds_within(DEADLINE, || {
                n += 1;
                n == 3
            })
            .await
        );
        assert!(!holds_within(Duration::from_millis(30), || false).await);
        assert!(!holds_within_blocking(Duration::from_millis(30), || false));
    }
}
