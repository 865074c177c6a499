//! The daily spend guard's rules: the caps `agent.lua` sets, the prices `models.yml` gives, the
//! records of the usage journal (`.perch/spend/`), their fold into one UTC day's totals, and the
//! verdict before each model request.
//!
//! A day is a UTC calendar day. Heartbeat runs pause when a day's spend reaches
//! [`HEARTBEAT_PAUSE_PERCENT`] of a cap, every run when it reaches the cap; the owner is told
//! once per level per day, and a new day starts from zero.

use crate::Timestamp;
use crate::name::{LaneKind, LaneName};
use chrono::{Days, NaiveDate};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The cap applied when `agent.lua` sets no `spend`.
pub const DEFAULT_TOKENS_PER_DAY: u64 = 2_000_000;

/// The share of a cap at which heartbeat runs pause, in percent.
pub const HEARTBEAT_PAUSE_PERCENT: u64 = 80;

/// The largest amount of money a cap or a price may be, in whole units.
pub const MAX_MONEY_UNITS: f64 = 1.0e9;

/// An amount of money in millionths of the currency `models.yml`'s prices are written in.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Money(u64);

impl Money {
    pub const ZERO: Money = Money(0);

    pub fn from_micros(micros: u64) -> Money {
        Money(micros)
    }

    pub fn micros(self) -> u64 {
        self.0
    }

    /// `units` (such as `1.25`) as money, if it is a finite amount from 0 to
    /// [`MAX_MONEY_UNITS`].
    pub fn from_units(units: f64) -> Option<Money> {
        if !units.is_finite() || !(0.0..=MAX_MONEY_UNITS).contains(&units) {
            return None;
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "checked above to be from 0 to 1e15 micros"
        )]
        let micros = (units * 1_000_000.0).round() as u64;
        Some(Money(micros))
    }

    pub fn saturating_add(self, other: Money) -> Money {
        Money(self.0.saturating_add(other.0))
    }

    /// Money as [`Display`](fmt::Display) shows it (`20`, `1.25`, `0.000125`): whole units and
    /// up to six decimals, read exactly.
    pub fn parse_units(text: &str) -> Option<Money> {
        let (units, fraction) = text.split_once('.').unwrap_or((text, ""));
        let digits = |part: &str| part.bytes().all(|byte| byte.is_ascii_digit());
        if units.is_empty() || !digits(units) || !digits(fraction) || fraction.len() > 6 {
            return None;
        }
        if text.contains('.') && fraction.is_empty() {
            return None;
        }
        let units: u64 = units.parse().ok()?;
        let micros: u64 = format!("{fraction:0<6}").parse().ok()?;
        units.checked_mul(1_000_000)?.checked_add(micros).map(Money)
    }
}

impl fmt::Display for Money {
    /// Whole units, with up to six decimals and no trailing zeros: `20`, `1.25`, `0.000125`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = self.0 / 1_000_000;
        let fraction = self.0 % 1_000_000;
        if fraction == 0 {
            return write!(f, "{units}");
        }
        let digits = format!("{fraction:06}");
        write!(f, "{units}.{}", digits.trim_end_matches('0'))
    }
}

/// Tokens one model reply used. `cached` input tokens are counted in `input` too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub input: u64,
    pub output: u64,
    pub cached: u64,
}

impl TokenUsage {
    /// What counts against `tokens_per_day`: input (cached included) and output.
    pub fn total(self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

/// A model's prices per million tokens, from `models.yml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Price {
    pub input: Money,
    pub output: Money,
    /// Cached input tokens; without it they cost what other input tokens cost.
    pub cached: Option<Money>,
}

impl Price {
    /// What `usage` costs, rounded up to the next millionth.
    pub fn cost(&self, usage: TokenUsage) -> Money {
        let cached = usage.cached.min(usage.input);
        let uncached = usage.input - cached;
        let per_million = u128::from(uncached) * u128::from(self.input.0)
            + u128::from(cached) * u128::from(self.cached.unwrap_or(self.input).0)
            + u128::from(usage.output) * u128::from(self.output.0);
        let micros = per_million.div_ceil(1_000_000);
        Money(u64::try_from(micros).unwrap_or(u64::MAX))
    }
}

/// The daily caps. A cap that is `None` does not apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Caps {
    pub tokens_per_day: Option<u64>,
    /// In the currency of `models.yml`'s prices.
    pub cost_per_day: Option<Money>,
}

/// What `agent.lua` says about spending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum SpendPolicy {
    /// No `spend`: the built-in cap of [`DEFAULT_TOKENS_PER_DAY`] tokens a day.
    BuiltIn,
    /// `spend = { tokens_per_day = ..., cost_per_day = ... }`.
    Set(Caps),
    /// `spend = false`: uncapped, by the owner's choice.
    Off,
}

impl SpendPolicy {
    /// The caps in force.
    pub fn caps(self) -> Caps {
        match self {
            SpendPolicy::BuiltIn => Caps {
                tokens_per_day: Some(DEFAULT_TOKENS_PER_DAY),
                cost_per_day: None,
            },
            SpendPolicy::Set(caps) => caps,
            SpendPolicy::Off => Caps::default(),
        }
    }

    /// The policy in a few words, as `perch info` shows it.
    pub fn describe(self) -> String {
        let caps = self.caps();
        let mut parts = Vec::new();
        if let Some(tokens) = caps.tokens_per_day {
            parts.push(format!("{tokens} tokens"));
        }
        if let Some(cost) = caps.cost_per_day {
            parts.push(format!("{cost} in models.yml's prices"));
        }
        let heartbeats =
            format!("heartbeats pause at {HEARTBEAT_PAUSE_PERCENT}%, everything at 100%");
        match self {
            SpendPolicy::BuiltIn => format!(
                "{} a day (UTC), the built-in default: agent.lua sets no spend; {heartbeats}",
                parts.join(" or ")
            ),
            SpendPolicy::Set(_) => format!("{} a day (UTC); {heartbeats}", parts.join(" or ")),
            SpendPolicy::Off => "uncapped (spend = false in agent.lua)".to_owned(),
        }
    }
}

/// Which runs a verdict is for: heartbeats pause first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    Conversation,
    Heartbeat,
}

impl RunKind {
    /// A run in a heartbeat task's own lane or its dry-run lane is a heartbeat's; every other
    /// lane holds conversations (see [`LaneKind`]).
    pub fn of_lane(lane: &LaneName) -> RunKind {
        match lane.kind() {
            LaneKind::Heartbeat(_) | LaneKind::DryRun(_) => RunKind::Heartbeat,
            LaneKind::Conversation => RunKind::Conversation,
        }
    }
}

/// How far a day's spend has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// [`HEARTBEAT_PAUSE_PERCENT`] of a cap: heartbeat runs pause.
    Heartbeats,
    /// A cap: every run pauses.
    All,
}

/// One line of the usage journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SpendRecord {
    /// One model reply's usage, and what it cost at the model's price then.
    Usage {
        at: Timestamp,
        lane: String,
        model: String,
        input: u64,
        output: u64,
        cached: u64,
        cost: Money,
    },
    /// The owner was told that the day's spend reached `level`.
    Told { at: Timestamp, level: Level },
}

impl SpendRecord {
    pub fn at(&self) -> Timestamp {
        match self {
            SpendRecord::Usage { at, .. } | SpendRecord::Told { at, .. } => *at,
        }
    }
}

/// The UTC day `at` falls on.
pub fn day_of(at: Timestamp) -> NaiveDate {
    at.date_naive()
}

/// When the day of `now` ends: the next 00:00 UTC.
pub fn resets_at(now: Timestamp) -> Timestamp {
    day_of(now)
        .checked_add_days(Days::new(1))
        .and_then(|day| day.and_hms_opt(0, 0, 0))
        .map_or(now, |midnight| midnight.and_utc())
}

/// One day's spend, folded from the usage journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendDay {
    pub day: NaiveDate,
    pub tokens: u64,
    pub cost: Money,
    /// The highest level the owner was told about today.
    pub told: Option<Level>,
    /// The journal items this day is made of, consumed once it is over.
    pub seqs: Vec<u64>,
}

impl SpendDay {
    /// Nothing spent yet on the day of `now`.
    pub fn empty(now: Timestamp) -> SpendDay {
        SpendDay {
            day: day_of(now),
            tokens: 0,
            cost: Money::ZERO,
            told: None,
            seqs: Vec::new(),
        }
    }

    /// Folds the journal's records (with their sequence numbers) into the day of `now`; returns
    /// it and the sequence numbers of every other day's records, which no longer count.
    pub fn fold(
        records: impl IntoIterator<Item = (u64, SpendRecord)>,
        now: Timestamp,
    ) -> (SpendDay, Vec<u64>) {
        let mut today = SpendDay::empty(now);
        let mut stale = Vec::new();
        for (seq, record) in records {
            if day_of(record.at()) == today.day {
                today.add(&record);
                today.seqs.push(seq);
            } else {
                stale.push(seq);
            }
        }
        (today, stale)
    }

    /// Moves on to the day of `now` if it is a new one; returns the sequence numbers of the
    /// day that ended.
    pub fn roll(&mut self, now: Timestamp) -> Vec<u64> {
        if day_of(now) == self.day {
            return Vec::new();
        }
        std::mem::replace(self, SpendDay::empty(now)).seqs
    }

    /// Adds one of this day's records.
    pub fn add(&mut self, record: &SpendRecord) {
        match record {
            SpendRecord::Usage {
                input,
                output,
                cost,
                ..
            } => {
                self.tokens = self.tokens.saturating_add(input.saturating_add(*output));
                self.cost = self.cost.saturating_add(*cost);
            }
            SpendRecord::Told { level, .. } => self.told = self.told.max(Some(*level)),
        }
    }

    /// The cap that `percent` of has been reached, if one has.
    fn reached(&self, caps: Caps, percent: u64) -> Option<Reached> {
        let over =
            |spent: u64, cap: u64| u128::from(spent) * 100 >= u128::from(cap) * u128::from(percent);
        if let Some(cap) = caps.tokens_per_day
            && over(self.tokens, cap)
        {
            return Some(Reached {
                cap: format!("{cap} tokens"),
                spent: format!("{} tokens used today", self.tokens),
            });
        }
        if let Some(cap) = caps.cost_per_day
            && over(self.cost.0, cap.0)
        {
            return Some(Reached {
                cap: format!("{cap} (in models.yml's prices)"),
                spent: format!("{} spent today", self.cost),
            });
        }
        None
    }

    /// The highest level the day's spend has reached, with the cap that reached it.
    fn level(&self, caps: Caps) -> Option<(Level, Reached)> {
        self.reached(caps, 100)
            .map(|reached| (Level::All, reached))
            .or_else(|| {
                self.reached(caps, HEARTBEAT_PAUSE_PERCENT)
                    .map(|reached| (Level::Heartbeats, reached))
            })
    }

    /// Whether a run of `kind` may ask the model now; `Err` is the reason it may not.
    pub fn verdict(&self, caps: Caps, kind: RunKind, now: Timestamp) -> Result<(), String> {
        let resets = resets_at(now).format("%H:%M UTC");
        match (self.level(caps), kind) {
            (Some((Level::All, reached)), _) => Err(format!(
                "the daily spend cap of {} is reached ({}); it resets at {resets}",
                reached.cap, reached.spent
            )),
            (Some((Level::Heartbeats, reached)), RunKind::Heartbeat) => Err(format!(
                "heartbeats pause at {HEARTBEAT_PAUSE_PERCENT}% of the daily spend cap of {} ({}); \
                 they resume at {resets}",
                reached.cap, reached.spent
            )),
            _ => Ok(()),
        }
    }

    /// If the day's spend reached a level the owner was not told about, marks it told and
    /// returns the level and the owner's message.
    pub fn to_tell(&mut self, caps: Caps, now: Timestamp) -> Option<(Level, String)> {
        let (level, reached) = self.level(caps)?;
        if self.told >= Some(level) {
            return None;
        }
        self.told = Some(level);
        let resets = resets_at(now).format("%H:%M UTC");
        let message = match level {
            Level::All => format!(
                "The daily spend cap of {} is reached ({}). Every run is paused until {resets}; \
                 messages are answered with the reason and reach no model. To go on sooner, \
                 raise spend in agent.lua and restart perch.",
                reached.cap, reached.spent
            ),
            Level::Heartbeats => format!(
                "{HEARTBEAT_PAUSE_PERCENT}% of the daily spend cap of {} is reached ({}). \
                 Heartbeats are paused until {resets}; conversations go on until the cap.",
                reached.cap, reached.spent
            ),
        };
        Some((level, message))
    }
}

/// The UTC day's spend as `perch status` shows it (its JSON is `spend_today` in `perch status
/// --json`): tokens, cost in `models.yml`'s currency, and the highest level the owner was told
/// about, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpendToday {
    pub day: NaiveDate,
    pub tokens: u64,
    /// Whole units, as [`Money`] shows them (`1.25`).
    #[serde(serialize_with = "money_units", deserialize_with = "from_money_units")]
    pub cost: Money,
    pub told: Option<Level>,
}

impl From<&SpendDay> for SpendToday {
    fn from(day: &SpendDay) -> SpendToday {
        SpendToday {
            day: day.day,
            tokens: day.tokens,
            cost: day.cost,
            told: day.told,
        }
    }
}

impl SpendToday {
    /// `perch status`'s line: `<n> tokens, cost <c> (UTC day <day>)`, and the level reached.
    pub fn summary(&self) -> String {
        format!(
            "{} tokens, cost {} (UTC day {}){}",
            self.tokens,
            self.cost,
            self.day,
            match self.told {
                Some(Level::All) => "; a cap was reached today".to_owned(),
                Some(Level::Heartbeats) => {
                    format!("; {HEARTBEAT_PAUSE_PERCENT}% of a cap was reached today")
                }
                None => String::new(),
            }
        )
    }
}

fn money_units<S: serde::Serializer>(money: &Money, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(money)
}

fn from_money_units<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Money, D::Error> {
    let text = String::deserialize(deserializer)?;
    Money::parse_units(&text)
        .ok_or_else(|| serde::de::Error::custom(format!("not an amount of money: {text:?}")))
}

/// A cap, and how much of it is spent, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reached {
    cap: String,
    spent: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn usage(when: &str, input: u64, output: u64, cost: u64) -> SpendRecord {
        SpendRecord::Usage {
            at: at(when),
            lane: "tg-42".into(),
            model: "fake/m1".into(),
            input,
            output,
            cached: 0,
            cost: Money::from_micros(cost),
        }
    }

    fn tokens(cap: u64) -> Caps {
        Caps {
            tokens_per_day: Some(cap),
            cost_per_day: None,
        }
    }

    #[test]
    fn money_reads_and_shows_units() {
        assert_eq!(Money::from_units(1.25), Some(Money::from_micros(1_250_000)));
        assert_eq!(Money::from_units(20.0).unwrap().to_string(), "20");
        assert_eq!(
            Money::from_units(0.000_125).unwrap().to_string(),
            "0.000125"
        );
        assert_eq!(Money::from_units(1.5).unwrap().to_string(), "1.5");
        assert_eq!(Money::from_units(-1.0), None);
        assert_eq!(Money::from_units(f64::NAN), None);
        assert_eq!(Money::from_units(2.0e9), None);
    }

    #[test]
    fn money_reads_back_exactly_as_it_shows() {
        for micros in [
            0,
            1,
            125,
            1_250_000,
            1_250_125,
            20_000_000,
            999_999_999_999_999,
        ] {
            let money = Money::from_micros(micros);
            assert_eq!(Money::parse_units(&money.to_string()), Some(money));
        }
        assert_eq!(
            Money::parse_units("0.10"),
            Some(Money::from_micros(100_000))
        );
        for bad in [
            "",
            ".5",
            "1.",
            "-1",
            "1.2345678",
            "1e3",
            " 1",
            "1,5",
            "18446744073709551615",
        ] {
            assert_eq!(Money::parse_units(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn spend_today_golden() {
        let today = SpendToday {
            day: NaiveDate::from_ymd_opt(2026, 12, 2).unwrap(),
            tokens: 150,
            cost: Money::from_micros(1_250_125),
            told: Some(Level::All),
        };
        let line = r#"{"day":"2026-12-02","tokens":150,"cost":"1.250125","told":"all"}"#;
        assert_eq!(serde_json::to_string(&today).unwrap(), line);
        assert_eq!(serde_json::from_str::<SpendToday>(line).unwrap(), today);
        assert_eq!(
            today.summary(),
            "150 tokens, cost 1.250125 (UTC day 2026-12-02); a cap was reached today"
        );
        let quiet = SpendToday {
            told: None,
            cost: Money::ZERO,
            ..today
        };
        assert_eq!(
            serde_json::to_string(&quiet).unwrap(),
            r#"{"day":"2026-12-02","tokens":150,"cost":"0","told":null}"#
        );
        assert_eq!(quiet.summary(), "150 tokens, cost 0 (UTC day 2026-12-02)");
        let heartbeats = SpendToday {
            told: Some(Level::Heartbeats),
            ..today
        };
        assert!(
            heartbeats
                .summary()
                .ends_with("; 80% of a cap was reached today")
        );
    }

    #[test]
    fn a_price_costs_cached_input_at_its_own_rate_rounding_up() {
        let price = Price {
            input: Money::from_units(1.25).unwrap(),
            output: Money::from_units(10.0).unwrap(),
            cached: Some(Money::from_units(0.125).unwrap()),
        };
        let usage = TokenUsage {
            input: 1_000_000,
            output: 100_000,
            cached: 400_000,
        };
        // 600k × 1.25 + 400k × 0.125 + 100k × 10 = 0.75 + 0.05 + 1.0
        assert_eq!(price.cost(usage), Money::from_units(1.8).unwrap());
        let without_cached = Price {
            cached: None,
            ..price
        };
        assert_eq!(without_cached.cost(usage), Money::from_units(2.25).unwrap());
        let one = TokenUsage {
            input: 1,
            output: 0,
            cached: 0,
        };
        assert_eq!(
            price.cost(one),
            Money::from_micros(2),
            "1.25 micros rounds up"
        );
    }

    #[test]
    fn the_fold_counts_only_todays_records_and_returns_the_rest() {
        let records = vec![
            (1, usage("2026-03-01T23:59:59Z", 500, 500, 7)),
            (
                2,
                SpendRecord::Told {
                    at: at("2026-03-01T23:59:59Z"),
                    level: Level::All,
                },
            ),
            (3, usage("2026-03-02T00:00:00Z", 40, 20, 3)),
            (4, usage("2026-03-02T10:00:00Z", 30, 10, 2)),
        ];
        let (today, stale) = SpendDay::fold(records, at("2026-03-02T12:00:00Z"));
        assert_eq!(
            today,
            SpendDay {
                day: NaiveDate::from_ymd_opt(2026, 3, 2).unwrap(),
                tokens: 100,
                cost: Money::from_micros(5),
                told: None,
                seqs: vec![3, 4],
            }
        );
        assert_eq!(stale, vec![1, 2]);
    }

    #[test]
    fn heartbeats_pause_at_eighty_percent_and_everything_at_the_cap() {
        let now = at("2026-03-02T12:00:00Z");
        let mut day = SpendDay::empty(now);
        let caps = tokens(100);
        day.add(&usage("2026-03-02T11:00:00Z", 50, 29, 0));
        assert_eq!(day.verdict(caps, RunKind::Heartbeat, now), Ok(()));
        day.add(&usage("2026-03-02T11:00:00Z", 1, 0, 0));
        assert_eq!(
            day.verdict(caps, RunKind::Heartbeat, now),
            Err(
                "heartbeats pause at 80% of the daily spend cap of 100 tokens (80 tokens used \
                 today); they resume at 00:00 UTC"
                    .into()
            )
        );
        assert_eq!(day.verdict(caps, RunKind::Conversation, now), Ok(()));
        day.add(&usage("2026-03-02T11:30:00Z", 10, 10, 0));
        for kind in [RunKind::Conversation, RunKind::Heartbeat] {
            assert_eq!(
                day.verdict(caps, kind, now),
                Err(
                    "the daily spend cap of 100 tokens is reached (100 tokens used today); it \
                     resets at 00:00 UTC"
                        .into()
                )
            );
        }
    }

    #[test]
    fn a_cost_cap_trips_on_the_money_spent() {
        let now = at("2026-03-02T12:00:00Z");
        let mut day = SpendDay::empty(now);
        let caps = Caps {
            tokens_per_day: Some(1_000_000),
            cost_per_day: Some(Money::from_units(20.0).unwrap()),
        };
        day.add(&usage("2026-03-02T11:00:00Z", 10, 10, 20_500_000));
        assert_eq!(
            day.verdict(caps, RunKind::Conversation, now),
            Err(
                "the daily spend cap of 20 (in models.yml's prices) is reached (20.5 spent \
                 today); it resets at 00:00 UTC"
                    .into()
            )
        );
    }

    #[test]
    fn the_day_resets_at_midnight_utc() {
        let caps = tokens(100);
        let evening = at("2026-03-02T23:59:59Z");
        let mut day = SpendDay::empty(evening);
        day.add(&usage("2026-03-02T23:00:00Z", 100, 100, 0));
        day.seqs.push(7);
        assert!(day.verdict(caps, RunKind::Conversation, evening).is_err());
        assert_eq!(resets_at(evening), at("2026-03-03T00:00:00Z"));
        assert_eq!(day.roll(evening), Vec::<u64>::new());
        let morning = at("2026-03-03T00:00:00Z");
        assert_eq!(day.roll(morning), vec![7]);
        assert_eq!(day, SpendDay::empty(morning));
        assert_eq!(day.verdict(caps, RunKind::Heartbeat, morning), Ok(()));
    }

    #[test]
    fn the_owner_is_told_once_per_level_per_day() {
        let now = at("2026-03-02T12:00:00Z");
        let caps = tokens(100);
        let mut day = SpendDay::empty(now);
        assert_eq!(day.to_tell(caps, now), None);
        day.add(&usage("2026-03-02T11:00:00Z", 80, 5, 0));
        let (level, message) = day.to_tell(caps, now).unwrap();
        assert_eq!(level, Level::Heartbeats);
        assert!(
            message.starts_with("80% of the daily spend cap of 100 tokens"),
            "{message}"
        );
        assert_eq!(day.to_tell(caps, now), None);
        day.add(&usage("2026-03-02T11:10:00Z", 80, 5, 0));
        assert_eq!(
            day.to_tell(caps, now).map(|(level, _)| level),
            Some(Level::All)
        );
        assert_eq!(day.to_tell(caps, now), None);

        // Straight past the cap: one message, for the cap.
        let mut jump = SpendDay::empty(now);
        jump.add(&usage("2026-03-02T11:00:00Z", 100, 50, 0));
        assert_eq!(
            jump.to_tell(caps, now).map(|(level, _)| level),
            Some(Level::All)
        );
        assert_eq!(jump.to_tell(caps, now), None);

        // A told record from the journal counts.
        let mut told = SpendDay::empty(now);
        told.add(&usage("2026-03-02T11:00:00Z", 100, 50, 0));
        told.add(&SpendRecord::Told {
            at: now,
            level: Level::All,
        });
        assert_eq!(told.to_tell(caps, now), None);
    }

    #[test]
    fn uncapped_never_pauses_and_the_default_is_capped() {
        let now = at("2026-03-02T12:00:00Z");
        let mut day = SpendDay::empty(now);
        day.add(&usage(
            "2026-03-02T11:00:00Z",
            u64::MAX / 2,
            u64::MAX / 2,
            u64::MAX,
        ));
        let off = SpendPolicy::Off.caps();
        assert_eq!(day.verdict(off, RunKind::Heartbeat, now), Ok(()));
        assert_eq!(day.to_tell(off, now), None);
        assert_eq!(
            SpendPolicy::BuiltIn.caps().tokens_per_day,
            Some(DEFAULT_TOKENS_PER_DAY)
        );
        assert!(
            day.verdict(SpendPolicy::BuiltIn.caps(), RunKind::Conversation, now)
                .is_err()
        );
    }

    #[test]
    fn heartbeat_lanes_are_told_apart_by_their_kind() {
        let of = |name: &str| RunKind::of_lane(&LaneName::try_from(name).unwrap());
        assert_eq!(of("heartbeat-prs"), RunKind::Heartbeat);
        assert_eq!(of("heartbeat-prs-dry-run"), RunKind::Heartbeat);
        assert_eq!(of("tg-42"), RunKind::Conversation);
        assert_eq!(of("terminal"), RunKind::Conversation);
        assert_eq!(of("heartbeat-Team-1"), RunKind::Conversation);
        assert_eq!(
            of("chat-heartbeat-foo-0123456789abcdef"),
            RunKind::Conversation
        );
    }

    #[test]
    fn records_read_back() {
        let record = usage("2026-03-02T11:00:00Z", 1, 2, 3);
        let text = serde_json::to_string(&record).unwrap();
        assert!(text.starts_with("{\"type\":\"usage\""), "{text}");
        assert_eq!(serde_json::from_str::<SpendRecord>(&text).unwrap(), record);
    }
}
