//! The pure core of a subscription's reconnects (see [`crate::subscriber`]): the point it
//! resumes from, the stream and cursor acknowledged last. It moves to another stream only
//! with the first ack there, so a connection lost before that presents the old stream
//! again and the hub tells the subscriber again that its history is gone (the
//! `resync-required` `*` it may not have read).

use fleetwatch_protocol::message::ResumePoint;

/// Where a subscription resumes, and the stream it reads now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resume {
    /// The stream of the resume point.
    stream: Option<String>,
    /// The cursor acknowledged last in `stream`.
    acked: Option<u64>,
    /// The stream of the current (or last) connection.
    reading: Option<String>,
}

impl Resume {
    /// The hub placed the subscription in `stream` after `cursor`. The first subscription
    /// resumes there after a lost connection (rather than asking for `latest` again, which
    /// would skip what was stored meanwhile); later ones keep their resume point until the
    /// first ack, unless the hub placed them below it in the same stream (then there).
    pub fn subscribed(&mut self, stream: String, cursor: u64) {
        if self.stream.is_none() {
            self.stream = Some(stream.clone());
            self.acked = Some(cursor);
        } else if self.stream.as_deref() == Some(stream.as_str()) && self.acked.is_some_and(|a| cursor < a) {
            // The hub placed it below what it acknowledged: its cursor lay beyond the end
            // of the hub's log (records it had were lost: a stream recreated below offsets
            // handed out, with no replica left that knew them), and a `resync-required`
            // `*` comes first. What follows under those offsets is new; resuming after the
            // old ack would skip it (seed 71972).
            self.acked = Some(cursor);
        }
        self.reading = Some(stream);
    }

    /// Everything up to `cursor` was handled. The first ack in a new stream moves the
    /// resume point there; within one stream it never moves back.
    pub fn ack(&mut self, cursor: u64) {
        if self.reading.is_some() && self.reading != self.stream {
            self.stream = self.reading.clone();
            self.acked = Some(cursor);
        } else {
            self.acked = Some(self.acked.map_or(cursor, |a| a.max(cursor)));
        }
    }

    /// The stream and cursor to present at the next subscribe.
    pub fn point(&self) -> Option<ResumePoint> {
        Some(ResumePoint { stream: self.stream.clone()?, cursor: self.acked? })
    }

    /// The stream the subscription reads (known once subscribed).
    pub fn reading(&self) -> Option<&str> {
        self.reading.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(stream: &str, cursor: u64) -> Option<ResumePoint> {
        Some(ResumePoint { stream: stream.into(), cursor })
    }

    #[test]
    fn the_first_subscription_resumes_where_the_hub_placed_it() {
        let mut r = Resume::default();
        assert_eq!(r.point(), None, "nothing to resume from before the first subscribe");
        r.subscribed("s1".into(), 40);
        assert_eq!(r.point(), point("s1", 40), "a reconnect must not ask for `latest` again");
        r.subscribed("s1".into(), 90);
        assert_eq!(r.point(), point("s1", 40), "only acks move it afterwards");
    }

    #[test]
    fn acks_never_move_the_point_back_within_a_stream() {
        let mut r = Resume::default();
        r.subscribed("s1".into(), 0);
        r.ack(10);
        r.ack(7);
        assert_eq!(r.point(), point("s1", 10));
    }

    #[test]
    fn a_new_stream_becomes_the_resume_point_only_at_its_first_ack() {
        let mut r = Resume::default();
        r.subscribed("s1".into(), 0);
        r.ack(500);
        // The hub's log was replaced: it placed the subscriber in s2 (with a resync `*`).
        r.subscribed("s2".into(), 3);
        assert_eq!(r.reading(), Some("s2"));
        assert_eq!(r.point(), point("s1", 500), "lost before an ack: present s1 again, get the resync again");
        // The first ack in s2 moves there, even though it is lower than s1's.
        r.ack(4);
        assert_eq!(r.point(), point("s2", 4));
    }

    #[test]
    fn a_placement_below_the_ack_in_the_same_stream_is_followed() {
        let mut r = Resume::default();
        r.subscribed("s1".into(), 0);
        r.ack(100);
        // The log lost records past 60: the hub places the subscriber there (with a resync).
        r.subscribed("s1".into(), 60);
        assert_eq!(r.point(), point("s1", 60), "resuming after 100 would skip what is stored under 61..=100 now");
        r.subscribed("s1".into(), 80);
        assert_eq!(r.point(), point("s1", 60), "a placement above it does not move it");
    }
}
