//! How long a Web API call waits before it is made ([`Pace`]): Slack's limits are per method
//! across the workspace, so a `429` on a method holds every call of it, in every channel, for
//! its `Retry-After`; and a channel takes about one message a second, so posts to one channel
//! are spaced by [`POST_INTERVAL`]. The clock is passed in, as a duration since any fixed start
//! (a monotonic clock's reading).

use std::collections::BTreeMap;
use std::time::Duration;

/// The spacing of posts to one channel (Slack allows about one message a second per channel,
/// with short bursts over it).
pub const POST_INTERVAL: Duration = Duration::from_secs(1);

/// The methods that post a message in a channel, and so are spaced per channel.
const POSTING: &[&str] = &["chat.postMessage", "files.completeUploadExternal"];

/// One Web API call: its method, and the channel it posts in, if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call<'a> {
    pub method: &'a str,
    pub channel: Option<&'a str>,
}

/// The holds and spacing of one workspace's calls. It keeps only what still delays a call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pace {
    /// Per method: no call before this time.
    held_until: BTreeMap<String, Duration>,
    /// Per channel: no post before this time.
    next_post: BTreeMap<String, Duration>,
}

impl Pace {
    pub fn new() -> Pace {
        Pace::default()
    }

    /// How long `call` waits at `now`: until its method's hold after a `429` is over and, for a
    /// post, until its channel's spacing allows one.
    pub fn wait_before(&self, call: Call<'_>, now: Duration) -> Duration {
        let held = self.held_until.get(call.method).copied();
        let spaced = call
            .channel
            .filter(|_| POSTING.contains(&call.method))
            .and_then(|channel| self.next_post.get(channel).copied());
        [held, spaced]
            .into_iter()
            .flatten()
            .max()
            .map_or(Duration::ZERO, |until| until.saturating_sub(now))
    }

    /// `call` was made at `now`.
    pub fn called(&mut self, call: Call<'_>, now: Duration) {
        self.forget_before(now);
        if let Some(channel) = call.channel.filter(|_| POSTING.contains(&call.method)) {
            self.next_post
                .insert(channel.to_owned(), now.saturating_add(POST_INTERVAL));
        }
    }

    /// Slack answered `method` with `429` at `now`: every call of it waits `retry_after`.
    pub fn rate_limited(&mut self, method: &str, now: Duration, retry_after: Duration) {
        self.forget_before(now);
        let until = now.saturating_add(retry_after);
        let held = self.held_until.entry(method.to_owned()).or_default();
        *held = (*held).max(until);
    }

    /// How many holds and spacings are kept.
    pub fn len(&self) -> usize {
        self.held_until.len() + self.next_post.len()
    }

    /// Nothing delays any call.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn forget_before(&mut self, now: Duration) {
        self.held_until.retain(|_, until| *until > now);
        self.next_post.retain(|_, until| *until > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn secs(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    fn post(channel: &str) -> Call<'_> {
        Call {
            method: "chat.postMessage",
            channel: Some(channel),
        }
    }

    const USERS_INFO: Call<'static> = Call {
        method: "users.info",
        channel: None,
    };

    #[test]
    fn posts_to_one_channel_are_spaced_and_other_channels_are_not_held() {
        let mut pace = Pace::new();
        assert_eq!(pace.wait_before(post("C1"), secs(10)), Duration::ZERO);
        pace.called(post("C1"), secs(10));
        let cases: &[(Call, Duration, Duration)] = &[
            (post("C1"), secs(10), POST_INTERVAL),
            (
                post("C1"),
                Duration::from_millis(10_400),
                Duration::from_millis(600),
            ),
            (post("C1"), secs(11), Duration::ZERO),
            (post("C2"), secs(10), Duration::ZERO),
            (USERS_INFO, secs(10), Duration::ZERO),
            (
                Call {
                    method: "files.completeUploadExternal",
                    channel: Some("C1"),
                },
                secs(10),
                POST_INTERVAL,
            ),
            (
                Call {
                    method: "files.getUploadURLExternal",
                    channel: Some("C1"),
                },
                secs(10),
                Duration::ZERO,
            ),
        ];
        for (call, now, wait) in cases {
            assert_eq!(pace.wait_before(*call, *now), *wait, "{call:?} at {now:?}");
        }
    }

    #[test]
    fn a_429_holds_the_method_everywhere_and_only_the_method() {
        let mut pace = Pace::new();
        pace.rate_limited("chat.postMessage", secs(100), secs(30));
        pace.rate_limited("chat.postMessage", secs(101), secs(5));
        assert_eq!(pace.wait_before(post("C1"), secs(100)), secs(30));
        assert_eq!(pace.wait_before(post("C9"), secs(120)), secs(10));
        assert_eq!(pace.wait_before(USERS_INFO, secs(100)), Duration::ZERO);
        pace.called(post("C1"), secs(129));
        assert_eq!(pace.wait_before(post("C1"), secs(129)), secs(1));
        assert_eq!(pace.wait_before(post("C1"), secs(131)), Duration::ZERO);
    }

    #[test]
    fn what_no_longer_delays_anything_is_forgotten() {
        let mut pace = Pace::new();
        for channel in 0..1000 {
            pace.called(post(&format!("C{channel}")), secs(1));
        }
        pace.rate_limited("users.info", secs(1), secs(2));
        assert_eq!(pace.len(), 1001);
        pace.called(post("C0"), secs(5));
        assert_eq!(pace.len(), 1);
        pace.called(USERS_INFO, secs(7));
        assert!(pace.is_empty());
    }
}
