//! Times and calendars: parsing a window's `begin` and `end` (times of day with an offset
//! for recurring windows, RFC 3339 date-times for one-off ones, as Go's `time.Parse` reads
//! them) and finding the next occurrence of a window at a given instant.
//!
//! Pure functions of their inputs (the instant is a parameter, never the system clock), so
//! every calendar edge — overnight windows, offsets that move the weekday, windows already
//! in progress — is tested here without waiting for a real clock.

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::Offset;
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::policy::WindowSpec;
use super::{DAY_NAMES, DEFAULT_MIN_REMAINING, MaintenanceError};

/// What is wrong with a `begin` or `end` value (the [`MaintenanceError::InvalidTime`] reason).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TimeError {
    /// A number (year, hour, ...) is missing where it should be.
    #[error("expected {what} at position {position}")]
    Expected {
        /// What was expected, e.g. `hour`.
        what: &'static str,
        /// Where, from 1.
        position: usize,
    },
    /// A separator is missing where it should be.
    #[error("expected {expected:?} at position {position}")]
    ExpectedChar {
        /// The separator.
        expected: char,
        /// Where, from 1.
        position: usize,
    },
    /// A date that does not exist, e.g. `2024-02-30`.
    #[error("no such date {0}")]
    NoSuchDate(String),
    /// Hours, minutes or seconds out of range, e.g. `24:00:00`.
    #[error("{0} is not a time of day")]
    NotATimeOfDay(String),
    /// The UTC offset's hours or minutes are out of range.
    #[error("offset out of range")]
    OffsetOutOfRange,
    /// A value jiff refuses (out of its range).
    #[error("{0}")]
    OutOfRange(jiff::Error),
    /// No `Z` or `±HH:MM` after the time.
    #[error("missing UTC offset (Z or ±HH:MM)")]
    MissingOffset,
    /// Something follows the time.
    #[error("unexpected {0:?} after the time")]
    Trailing(String),
}

/// How to pick a window.
///
/// ```
/// use fleetwatch_api::maintenance::NextWindowOptions;
/// let opts = NextWindowOptions { ongoing: true, ..NextWindowOptions::default() };
/// assert_eq!(opts.min_remaining, jiff::SignedDuration::from_mins(20));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextWindowOptions {
    /// Also return a window that has already begun, if more than `min_remaining` of it is
    /// left. Without it, only a window that begins after the resolution time qualifies.
    pub ongoing: bool,
    /// With `ongoing`: how much of a window must remain (strictly more). Default 20 minutes.
    pub min_remaining: SignedDuration,
}

impl Default for NextWindowOptions {
    fn default() -> Self {
        Self { ongoing: false, min_remaining: DEFAULT_MIN_REMAINING }
    }
}

/// A resolved maintenance window; serializes as `{"begin": RFC 3339, "end": RFC 3339}`.
///
/// ```
/// use fleetwatch_api::maintenance::Window;
/// let w = Window { begin: "2024-10-12T22:00:00Z".parse().unwrap(), end: "2024-10-13T02:00:00Z".parse().unwrap() };
/// assert!(w.contains("2024-10-13T01:00:00Z".parse().unwrap()));
/// assert_eq!(serde_json::to_string(&w).unwrap(),
///            r#"{"begin":"2024-10-12T22:00:00Z","end":"2024-10-13T02:00:00Z"}"#);
/// ```
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// When the window opens.
    pub begin: Timestamp,
    /// When it closes.
    pub end: Timestamp,
}

impl Window {
    /// Whether `at` lies in the window (`begin <= at < end`).
    pub fn contains(&self, at: Timestamp) -> bool {
        self.begin <= at && at < self.end
    }
}

/// A window checked and parsed, ready to yield occurrences.
#[derive(Clone, Debug)]
pub(super) enum CompiledWindow {
    /// Recurs on `days` (indexed by `Weekday::to_monday_zero_offset`).
    Recurring {
        days: [bool; 7],
        begin: WindowTime,
        end: WindowTime,
    },
    Absolute {
        begin: Timestamp,
        end: Timestamp,
    },
}

impl CompiledWindow {
    /// Checks and parses a window as written; `location` names it in errors.
    pub(super) fn new(spec: &WindowSpec, location: &str) -> Result<Self, MaintenanceError> {
        let time = |value: &Option<String>, field: &str| match value {
            None => Ok(WindowTime::GO_ZERO),
            Some(v) => WindowTime::parse(v).map_err(|reason| MaintenanceError::InvalidTime {
                location: format!("{location}.{field}"),
                value: v.clone(),
                reason,
            }),
        };
        let (begin, end) = (time(&spec.begin, "begin")?, time(&spec.end, "end")?);
        if spec.days.is_empty() {
            if begin.date.is_none() || end.date.is_none() {
                return Err(MaintenanceError::TimeOfDayWithoutDays {
                    location: location.to_string(),
                    begin: spec.begin.clone().unwrap_or_default(),
                    end: spec.end.clone().unwrap_or_default(),
                });
            }
            return Ok(Self::Absolute { begin: begin.instant(), end: end.instant() });
        }
        let mut days = [false; 7];
        for day in &spec.days {
            let Some(i) = DAY_NAMES.iter().position(|d| d == day) else {
                return Err(MaintenanceError::UnknownDay { location: format!("{location}.days"), day: day.clone() });
            };
            days[i] = true;
        }
        Ok(Self::Recurring { days, begin, end })
    }

    /// The first occurrence of this window that qualifies at `at`.
    pub(super) fn next(&self, at: Timestamp, opts: NextWindowOptions) -> Option<Window> {
        let qualifies = |w: &Window| {
            let ok =
                if opts.ongoing { at.checked_add(opts.min_remaining).is_ok_and(|t| t < w.end) } else { at < w.begin };
            ok.then_some(*w)
        };
        match self {
            Self::Absolute { begin, end } => {
                let w = Window { begin: *begin, end: *end };
                if w.end <= w.begin { None } else { qualifies(&w) }
            }
            Self::Recurring { days, begin, end } => {
                // Occurrences from the day before `at` (in begin's offset), so one that began
                // yesterday and is still running is seen, up to a week ahead.
                let today = begin.offset.to_datetime(at).date();
                let mut day = today.yesterday().ok()?;
                for _ in 0..9 {
                    if days[day.weekday().to_monday_zero_offset() as usize] {
                        let w = begin.occurrence(day, end)?;
                        if let Some(w) = qualifies(&w) {
                            return Some(w);
                        }
                    }
                    day = day.tomorrow().ok()?;
                }
                None
            }
        }
    }
}

/// A policy time: a time of day (with a date for RFC 3339 values) and its UTC offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WindowTime {
    /// `None` for a time-only value; Go dates those 0000-01-01.
    date: Option<Date>,
    time: Time,
    offset: Offset,
}

impl WindowTime {
    /// Go's zero `time.Time`, which an absent `begin` or `end` is in lifecycle-manager.
    const GO_ZERO: WindowTime =
        WindowTime { date: Some(jiff::civil::date(1, 1, 1)), time: Time::midnight(), offset: Offset::UTC };

    /// The instant, for absolute windows (a time-only value is on 0000-01-01, as in Go).
    fn instant(&self) -> Timestamp {
        let date = self.date.unwrap_or(jiff::civil::date(0, 1, 1));
        self.offset.to_timestamp(date.to_datetime(self.time)).unwrap_or(Timestamp::MIN)
    }

    /// The occurrence of a recurring window beginning on `day` (in this time's offset) and
    /// ending at `end`'s time of day, on the next day if not after the begin.
    fn occurrence(&self, day: Date, end: &WindowTime) -> Option<Window> {
        let clock = |t: &WindowTime| Time::new(t.time.hour(), t.time.minute(), t.time.second(), 0).ok();
        let begin = self.offset.to_timestamp(DateTime::from_parts(day, clock(self)?)).ok()?;
        let mut end = end.offset.to_timestamp(DateTime::from_parts(day, clock(end)?)).ok()?;
        while end <= begin {
            end = end.checked_add(SignedDuration::from_hours(24)).ok()?;
        }
        Some(Window { begin, end })
    }

    /// Parses `HH:MM:SS[.fff](Z|±HH:MM)` or `YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)`, as Go's
    /// `time.Parse` with the layouts `15:04:05Z07:00` and RFC 3339 does.
    fn parse(value: &str) -> Result<WindowTime, TimeError> {
        let mut c = Cursor { s: value.as_bytes(), i: 0 };
        let date = if value.len() > 10 && value.as_bytes()[4] == b'-' {
            let y = c.num(4, 4, "year")?;
            c.lit(b'-')?;
            let m = c.num(2, 2, "month")?;
            c.lit(b'-')?;
            let d = c.num(2, 2, "day")?;
            c.lit(b'T')?;
            Some(
                Date::new(y as i16, m as i8, d as i8)
                    .map_err(|_| TimeError::NoSuchDate(format!("{y:04}-{m:02}-{d:02}")))?,
            )
        } else {
            None
        };
        let h = c.num(1, 2, "hour")?;
        c.lit(b':')?;
        let mi = c.num(2, 2, "minute")?;
        c.lit(b':')?;
        let s = c.num(2, 2, "second")?;
        let mut nanos = 0;
        if matches!(c.peek(), Some(b'.' | b',')) && c.s.get(c.i + 1).is_some_and(u8::is_ascii_digit) {
            c.i += 1;
            let start = c.i;
            while c.peek().is_some_and(|b| b.is_ascii_digit()) {
                c.i += 1;
            }
            let digits = &value[start..c.i.min(start + 9)];
            nanos = format!("{digits:0<9}").parse().unwrap_or(0);
        }
        if h > 23 || mi > 59 || s > 59 {
            return Err(TimeError::NotATimeOfDay(format!("{h:02}:{mi:02}:{s:02}")));
        }
        let time = Time::new(h as i8, mi as i8, s as i8, nanos).map_err(TimeError::OutOfRange)?;
        let offset = match c.peek() {
            Some(b'Z') => {
                c.i += 1;
                Offset::UTC
            }
            Some(sign @ (b'+' | b'-')) => {
                c.i += 1;
                let oh = c.num(2, 2, "offset hours")?;
                c.lit(b':')?;
                let om = c.num(2, 2, "offset minutes")?;
                if oh > 23 || om > 59 {
                    return Err(TimeError::OffsetOutOfRange);
                }
                let secs = (oh * 3600 + om * 60) as i32;
                Offset::from_seconds(if sign == b'-' { -secs } else { secs }).map_err(TimeError::OutOfRange)?
            }
            _ => return Err(TimeError::MissingOffset),
        };
        if c.i != c.s.len() {
            return Err(TimeError::Trailing(value[c.i..].to_string()));
        }
        Ok(WindowTime { date, time, offset })
    }
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn lit(&mut self, b: u8) -> Result<(), TimeError> {
        if self.peek() == Some(b) {
            self.i += 1;
            Ok(())
        } else {
            Err(TimeError::ExpectedChar { expected: b as char, position: self.i + 1 })
        }
    }

    /// `min..=max` ASCII digits.
    fn num(&mut self, min: usize, max: usize, what: &'static str) -> Result<u32, TimeError> {
        let start = self.i;
        while self.i - start < max && self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.i += 1;
        }
        if self.i - start < min {
            return Err(TimeError::Expected { what, position: start + 1 });
        }
        Ok(self.s[start..self.i].iter().fold(0, |n, b| n * 10 + u32::from(b - b'0')))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::super::*;
    use super::*;

    #[test]
    fn maintenance_overnight_windows() {
        let policy = r#"{"default": {"days": ["Sat"], "begin": "22:00:00Z", "end": "02:00:00Z"}}"#;
        let l = RuntimeLabels::default();
        // From Wednesday: Saturday 22:00 to Sunday 02:00.
        let w = next(policy, &l, "2024-10-09T12:00:00Z").unwrap();
        assert_eq!(w, win("2024-10-12T22:00:00Z", "2024-10-13T02:00:00Z"));
        // Sunday 00:30 is inside the window that began on Saturday: found with `ongoing`
        // (lifecycle-manager starts at Sunday and would return the next Saturday).
        let p = MaintenancePolicySpec::from_json(policy).unwrap().compile().unwrap();
        let w = p.next_window(&l, ts("2024-10-13T00:30:00Z"), ongoing(SignedDuration::from_mins(20))).unwrap();
        assert_eq!(w, win("2024-10-12T22:00:00Z", "2024-10-13T02:00:00Z"));
        assert!(w.contains(ts("2024-10-13T00:30:00Z")));
        // Too little left of it: the next one.
        let w = p.next_window(&l, ts("2024-10-13T01:45:00Z"), ongoing(SignedDuration::from_mins(20))).unwrap();
        assert_eq!(w, win("2024-10-19T22:00:00Z", "2024-10-20T02:00:00Z"));
        // Exactly the minimum left is not enough (strictly more, as in lifecycle-manager).
        let w = p.next_window(&l, ts("2024-10-13T01:40:00Z"), ongoing(SignedDuration::from_mins(20))).unwrap();
        assert_eq!(w.begin, ts("2024-10-19T22:00:00Z"));
        let w = p.next_window(&l, ts("2024-10-13T01:39:59Z"), ongoing(SignedDuration::from_mins(20))).unwrap();
        assert_eq!(w.begin, ts("2024-10-12T22:00:00Z"));
        // Without `ongoing` a window must begin strictly later.
        let w = p.next_window(&l, ts("2024-10-12T22:00:00Z"), NextWindowOptions::default()).unwrap();
        assert_eq!(w.begin, ts("2024-10-19T22:00:00Z"));
        let w = p.next_window(&l, ts("2024-10-12T21:59:59Z"), NextWindowOptions::default()).unwrap();
        assert_eq!(w.begin, ts("2024-10-12T22:00:00Z"));
        // end == begin is a whole day.
        let day = r#"{"default": {"days": ["Mon"], "begin": "05:00:00Z", "end": "05:00:00Z"}}"#;
        let w = next(day, &l, "2024-10-09T12:00:00Z").unwrap();
        assert_eq!(w, win("2024-10-14T05:00:00Z", "2024-10-15T05:00:00Z"));
    }

    #[test]
    fn maintenance_days_are_in_the_offset_of_begin() {
        // Saturday 23:00 at +02:00 is Saturday 21:00 UTC; at -05:00 Saturday 22:00 is
        // Sunday 03:00 UTC.
        let l = RuntimeLabels::default();
        let east = r#"{"default": {"days": ["Sat"], "begin": "23:00:00+02:00", "end": "01:00:00+02:00"}}"#;
        let w = next(east, &l, "2024-10-09T12:00:00Z").unwrap();
        assert_eq!(w, win("2024-10-12T21:00:00Z", "2024-10-12T23:00:00Z"));
        let west = r#"{"default": {"days": ["Sat"], "begin": "22:00:00-05:00", "end": "23:30:00-05:00"}}"#;
        let w = next(west, &l, "2024-10-09T12:00:00Z").unwrap();
        assert_eq!(w, win("2024-10-13T03:00:00Z", "2024-10-13T04:30:00Z"));
        // Just after midnight UTC the window that begins a few hours later is found (it is on
        // the previous calendar day in -05:00).
        let w = next(west, &l, "2024-10-13T00:30:00Z").unwrap();
        assert_eq!(w, win("2024-10-13T03:00:00Z", "2024-10-13T04:30:00Z"));
        // A full RFC 3339 value in a recurring window: its time of day and offset count.
        let full = r#"{"default": {"days": ["Sun"], "begin": "2020-01-01T10:00:00.5+01:00", "end": "2020-01-01T12:00:00+01:00"}}"#;
        let w = next(full, &l, "2024-10-09T12:00:00Z").unwrap();
        assert_eq!(w, win("2024-10-13T09:00:00Z", "2024-10-13T11:00:00Z"));
    }

    #[test]
    fn maintenance_absolute_windows_in_listed_order() {
        let policy = r#"{"rules": [{"match": {"plan": "."}, "windows": [
            {"begin": "2024-12-01T10:00:00+01:00", "end": "2024-12-01T12:00:00+01:00"},
            {"begin": "2024-11-01T10:00:00Z", "end": "2024-11-01T12:00:00Z"},
            {"begin": "2024-10-20T12:00:00Z", "end": "2024-10-20T10:00:00Z"}]}]}"#;
        let l = labels("", "aws", "", "");
        // The first listed window that is still ahead wins, not the earliest.
        let w = next(policy, &l, "2024-10-01T00:00:00Z").unwrap();
        assert_eq!(w, win("2024-12-01T09:00:00Z", "2024-12-01T11:00:00Z"));
        let w = next(policy, &l, "2024-12-05T00:00:00Z");
        // An inverted window never qualifies; the rule matched, there is no default.
        let err = w.unwrap_err().to_string();
        assert_eq!(
            err,
            "no maintenance window found: rules[0] matches but has no upcoming window, and the policy has no default window"
        );
        // Times of day without days would be in year 0 (lifecycle-manager): such a window
        // could never open, so it is refused with what to write instead.
        let t = r#"{"default": {"begin": "01:00:00Z", "end": "02:00:00Z"}}"#;
        let err = next(t, &l, "2024-10-01T00:00:00Z").unwrap_err();
        assert!(matches!(err, MaintenanceError::TimeOfDayWithoutDays { .. }), "{err}");
        assert!(err.to_string().contains("default has times of day (01:00:00Z, 02:00:00Z) but no days"), "{err}");
    }

    #[test]
    fn maintenance_time_formats() {
        let ok = |s: &str| WindowTime::parse(s).unwrap();
        assert_eq!(ok("01:00:00Z").offset, Offset::UTC);
        assert_eq!(ok("1:00:00+00:00").time, jiff::civil::time(1, 0, 0, 0));
        assert_eq!(ok("21:30:15-05:30").offset, Offset::from_seconds(-(5 * 3600 + 1800)).unwrap());
        assert_eq!(ok("2024-10-10T20:00:00.250Z").instant(), ts("2024-10-10T20:00:00.25Z"));
        assert_eq!(ok("2024-10-10T20:00:00+02:00").instant(), ts("2024-10-10T18:00:00Z"));
        for bad in ["", "21:00", "21:00:00", "21:0:00Z", "21:00:60Z", "2024-10-10t20:00:00Z", "21:00:00+1:00", "x"] {
            assert!(WindowTime::parse(bad).is_err(), "{bad}");
        }
    }
}
