use super::*;

use chrono::{NaiveDate, Utc};

/// `y-m-d h:mi:s` UTC, in ms.
fn utc(y: i32, m: u32, d: u32, h: u32, mi: u32, s: u32) -> Millis {
    let t = NaiveDate::from_ymd_opt(y, m, d)
        .unwrap()
        .and_hms_opt(h, mi, s)
        .unwrap();
    Millis(Utc.from_utc_datetime(&t).timestamp_millis())
}

fn def(cron: Option<&str>, every: Option<Duration>, tz: Option<&str>) -> ScheduleDef {
    ScheduleDef {
        cron: cron.map(str::to_string),
        every,
        timezone: tz.map(str::to_string),
        ..ScheduleDef::new("acme", "nightly", "report", ScheduleSource::Api)
    }
}

fn cron_in(expr: &str, tz: &str, cursor: Millis) -> Schedule {
    let mut s = def(Some(expr), None, Some(tz)).build(Millis(0), 0).unwrap();
    s.next_at = cursor;
    s
}

fn every(secs: u64, cursor: Millis, missed: Missed) -> Schedule {
    let mut s = def(None, Some(Duration::from_secs(secs)), None)
        .build(Millis(0), 0)
        .unwrap();
    s.next_at = cursor;
    s.missed = missed;
    s
}

const S: i64 = 1000;
const GRACE: Duration = Duration::from_secs(60);

#[test]
fn a_definition_is_checked_field_by_field() {
    let cases: Vec<(ScheduleDef, &str)> = vec![
        (def(Some("61 * * * *"), None, None), "cron"),
        (def(Some("not cron"), None, None), "cron"),
        (def(None, None, None), "cron"),
        (
            def(Some("* * * * *"), Some(Duration::from_secs(1)), None),
            "every",
        ),
        (def(None, Some(Duration::ZERO), None), "every"),
        (def(None, Some(Duration::from_millis(999)), None), "every"),
        (
            def(Some("* * * * *"), None, Some("Mars/Olympus")),
            "timezone",
        ),
        (
            ScheduleDef {
                payload: Some("{not json".into()),
                ..def(Some("* * * * *"), None, None)
            },
            "payload",
        ),
        (
            ScheduleDef {
                payload: Some(format!("\"{}\"", "x".repeat(100))),
                ..def(Some("* * * * *"), None, None)
            },
            "payload",
        ),
        (
            ScheduleDef {
                name: "n".repeat(101),
                ..def(Some("* * * * *"), None, None)
            },
            "name",
        ),
        (
            ScheduleDef {
                handler: "".into(),
                ..def(Some("* * * * *"), None, None)
            },
            "handler",
        ),
        (
            ScheduleDef {
                max_attempts: Some(0),
                ..def(Some("* * * * *"), None, None)
            },
            "max_attempts",
        ),
        (
            ScheduleDef {
                missed: Some("twice".into()),
                ..def(Some("* * * * *"), None, None)
            },
            "missed",
        ),
        (
            ScheduleDef {
                missed: Some("each".into()),
                ..def(Some("* * * * *"), None, None)
            },
            "missed_cap",
        ),
        (
            ScheduleDef {
                missed: Some("each".into()),
                missed_cap: Some(0),
                ..def(Some("* * * * *"), None, None)
            },
            "missed_cap",
        ),
    ];
    for (d, field) in cases {
        let e = d.build(Millis(0), 50).expect_err(field);
        assert_eq!(e.field(), field, "{e}");
        assert!(e.to_string().starts_with(field), "{e}");
    }
    let e = def(Some("61 * * * *"), None, None)
        .build(Millis(0), 0)
        .unwrap_err();
    assert!(
        std::error::Error::source(&e).is_some(),
        "croner's error is kept"
    );
    let ok = def(Some("0 30 2 * * *"), None, Some("America/New_York"))
        .build(utc(2026, 1, 1, 0, 0, 0), 0)
        .unwrap();
    assert_eq!(ok.payload, "null");
    assert_eq!(ok.max_attempts, DEFAULT_MAX_ATTEMPTS);
    assert_eq!(ok.missed, Missed::Once);
    // 02:30 New York (EST, UTC-5) is 07:30 UTC.
    assert_eq!(ok.next_at, utc(2026, 1, 1, 7, 30, 0));
    assert_eq!(
        ok.local_time(ok.next_at).unwrap(),
        "2026-01-01T02:30:00-05:00"
    );
}

#[test]
fn an_interval_is_anchored_on_the_epoch() {
    let c = Cadence::Every(Duration::from_secs(30));
    let tz = Tz::UTC;
    assert_eq!(c.next_from(tz, Millis(0), true), Some(Millis(0)));
    assert_eq!(c.next_from(tz, Millis(0), false), Some(Millis(30 * S)));
    assert_eq!(c.next_from(tz, Millis(1), true), Some(Millis(30 * S)));
    assert_eq!(c.prev_before(tz, Millis(30 * S)), Some(Millis(0)));
    assert_eq!(c.prev_before(tz, Millis(30 * S + 1)), Some(Millis(30 * S)));
}

#[test]
fn a_cron_cadence_steps_over_sub_second_starts() {
    let s = cron_in("* * * * * *", "UTC", Millis(0));
    let c = &s.cadence;
    assert_eq!(c.next_from(Tz::UTC, Millis(500), true), Some(Millis(S)));
    assert_eq!(c.next_from(Tz::UTC, Millis(S), true), Some(Millis(S)));
    assert_eq!(c.next_from(Tz::UTC, Millis(S), false), Some(Millis(2 * S)));
    assert_eq!(c.prev_before(Tz::UTC, Millis(S)), Some(Millis(0)));
    assert_eq!(c.prev_before(Tz::UTC, Millis(1500)), Some(Millis(S)));
}

#[test]
fn on_time_occurrences_are_all_emitted_and_the_cursor_passes_now() {
    let s = every(10, Millis(100 * S), Missed::Skip);
    // Not due yet.
    let f = fire(&s, Millis(99 * S), GRACE);
    assert!(f.occurrences.is_empty());
    assert_eq!(f.next_at, Millis(100 * S));
    // Due exactly: the cursor itself.
    let f = fire(&s, Millis(100 * S), GRACE);
    assert_eq!(f.occurrences, [Millis(100 * S)]);
    assert_eq!(f.next_at, Millis(110 * S));
    // 35 s late, within the grace: all four, even under Skip.
    let f = fire(&s, Millis(135 * S), GRACE);
    assert_eq!(
        f.occurrences,
        [100, 110, 120, 130].map(|t| Millis(t * S)).to_vec()
    );
    assert!(!f.dropped_missed);
    assert_eq!(f.next_at, Millis(140 * S));
}

#[test]
fn missed_occurrences_follow_the_policy() {
    // Cursor at 100 s, now 1000 s, grace 60 s: 100..=930 are missed (84 of
    // them), 940..=1000 on time (7).
    let now = Millis(1000 * S);
    let on_time: Vec<Millis> = (94..=100).map(|t| Millis(t * 10 * S)).collect();
    let skip = fire(&every(10, Millis(100 * S), Missed::Skip), now, GRACE);
    assert_eq!(skip.occurrences, on_time);
    assert!(skip.dropped_missed);
    assert_eq!(skip.next_at, Millis(1010 * S));

    let once = fire(&every(10, Millis(100 * S), Missed::Once), now, GRACE);
    let mut want = vec![Millis(930 * S)];
    want.extend(&on_time);
    assert_eq!(
        once.occurrences, want,
        "the latest missed one, then the on-time ones"
    );
    assert!(once.dropped_missed);

    let each = fire(
        &every(10, Millis(100 * S), Missed::Each { cap: 3 }),
        now,
        GRACE,
    );
    let mut want = vec![Millis(910 * S), Millis(920 * S), Millis(930 * S)];
    want.extend(&on_time);
    assert_eq!(each.occurrences, want, "the most recent three missed ones");
    assert!(each.dropped_missed);

    // A cap above what was missed emits every missed one, and drops none.
    let all = fire(
        &every(10, Millis(900 * S), Missed::Each { cap: 100 }),
        now,
        GRACE,
    );
    assert_eq!(all.occurrences.len(), 4 + 7);
    assert_eq!(all.occurrences[0], Millis(900 * S));
    assert!(!all.dropped_missed);
    // Once with exactly one missed: that one, nothing dropped.
    let one = fire(&every(10, Millis(930 * S), Missed::Once), now, GRACE);
    assert_eq!(one.occurrences[0], Millis(930 * S));
    assert!(!one.dropped_missed);
}

#[test]
fn a_long_outage_costs_no_more_than_the_occurrences_emitted() {
    // Every second, down for ten years: one backward step per missed one
    // taken, one forward step per on-time one.
    let now = utc(2036, 1, 1, 0, 0, 0);
    let f = fire(
        &every(1, utc(2026, 1, 1, 0, 0, 0), Missed::Once),
        now,
        GRACE,
    );
    assert_eq!(f.occurrences.len(), 1 + 61);
    assert_eq!(f.next_at, now.plus(Duration::from_secs(1)));
    // A grace larger than the cap: the list stops at the cap and the cursor
    // at the first occurrence not in it, which the next tick emits.
    let f = fire(
        &every(1, now.minus(Duration::from_secs(5000)), Missed::Skip),
        now,
        Duration::from_secs(10_000),
    );
    assert_eq!(f.occurrences.len(), MAX_OCCURRENCES_PER_FIRE);
    assert_eq!(
        f.next_at,
        now.minus(Duration::from_secs(5000 - MAX_OCCURRENCES_PER_FIRE as u64))
    );
}

#[test]
fn a_cron_schedule_fires_in_its_zone() {
    // Every day at 09:00 in Paris (CET, UTC+1 in January).
    let s = cron_in("0 9 * * *", "Europe/Paris", utc(2026, 1, 5, 8, 0, 0));
    let f = fire(&s, utc(2026, 1, 5, 8, 0, 30), GRACE);
    assert_eq!(f.occurrences, [utc(2026, 1, 5, 8, 0, 0)]);
    assert_eq!(f.next_at, utc(2026, 1, 6, 8, 0, 0));
}

/// 2026-03-08: New York springs forward, 02:00 EST becomes 03:00 EDT; 02:30
/// does not exist that day. croner (and herald) runs a fixed-time job at
/// the first instant after the gap, 03:00 EDT (07:00 UTC), once.
#[test]
fn spring_forward_runs_a_skipped_time_once_at_the_end_of_the_gap() {
    let tz = "America/New_York";
    // The day before: 02:30 EST = 07:30 UTC.
    let s = cron_in("0 30 2 * * *", tz, utc(2026, 3, 7, 7, 30, 0));
    let f = fire(&s, utc(2026, 3, 7, 7, 30, 0), GRACE);
    assert_eq!(f.occurrences, [utc(2026, 3, 7, 7, 30, 0)]);
    assert_eq!(
        f.next_at,
        utc(2026, 3, 8, 7, 0, 0),
        "03:00 EDT on the day of the gap"
    );
    let mut s = s;
    s.next_at = f.next_at;
    assert_eq!(
        s.local_time(s.next_at).unwrap(),
        "2026-03-08T03:00:00-04:00"
    );
    let f = fire(&s, utc(2026, 3, 8, 7, 0, 0), GRACE);
    assert_eq!(f.occurrences, [utc(2026, 3, 8, 7, 0, 0)]);
    // The day after: 02:30 EDT = 06:30 UTC.
    assert_eq!(f.next_at, utc(2026, 3, 9, 6, 30, 0));
    // An hourly job skips the hour that does not exist: 01:00 EST, then
    // 03:00 EDT, one hour of real time apart.
    let h = cron_in("0 0 * * * *", tz, utc(2026, 3, 8, 6, 0, 0));
    let f = fire(&h, utc(2026, 3, 8, 7, 0, 0), Duration::from_secs(7200));
    assert_eq!(
        f.occurrences,
        [utc(2026, 3, 8, 6, 0, 0), utc(2026, 3, 8, 7, 0, 0)]
    );
}

/// 2026-11-01: New York falls back, 02:00 EDT becomes 01:00 EST; 01:30
/// happens twice. A fixed-time job runs once, at the first (EDT, 05:30
/// UTC); a job with a wildcard or step in its time fields runs at both.
#[test]
fn fall_back_runs_a_fixed_time_once_and_an_interval_at_both() {
    let tz = "America/New_York";
    let s = cron_in("0 30 1 * * *", tz, utc(2026, 10, 31, 5, 30, 0));
    let f = fire(&s, utc(2026, 10, 31, 5, 30, 0), GRACE);
    assert_eq!(f.next_at, utc(2026, 11, 1, 5, 30, 0), "01:30 EDT");
    let mut s = s;
    s.next_at = f.next_at;
    // The whole repeated hour and after, in one fire: once.
    let f = fire(&s, utc(2026, 11, 1, 7, 0, 0), Duration::from_secs(7200));
    assert_eq!(f.occurrences, [utc(2026, 11, 1, 5, 30, 0)]);
    // The next day, 01:30 EST = 06:30 UTC.
    assert_eq!(f.next_at, utc(2026, 11, 2, 6, 30, 0));

    let half_hourly = cron_in("0 */30 * * * *", tz, utc(2026, 11, 1, 5, 0, 0));
    let f = fire(
        &half_hourly,
        utc(2026, 11, 1, 7, 0, 0),
        Duration::from_secs(7200),
    );
    assert_eq!(
        f.occurrences,
        [
            utc(2026, 11, 1, 5, 0, 0),  // 01:00 EDT
            utc(2026, 11, 1, 5, 30, 0), // 01:30 EDT
            utc(2026, 11, 1, 6, 0, 0),  // 01:00 EST
            utc(2026, 11, 1, 6, 30, 0), // 01:30 EST
            utc(2026, 11, 1, 7, 0, 0),  // 02:00 EST
        ]
    );
}

#[test]
fn an_interval_ignores_daylight_saving() {
    let mut s = every(3600, utc(2026, 11, 1, 5, 0, 0), Missed::Once);
    s.timezone = "America/New_York".parse().unwrap();
    let f = fire(&s, utc(2026, 11, 1, 7, 0, 0), Duration::from_secs(7200));
    assert_eq!(f.occurrences.len(), 3, "every hour of real time");
}

#[test]
fn a_cron_that_never_matches_again_parks_the_cursor() {
    let s = cron_in("0 0 0 1 1 * 2020", "UTC", utc(2020, 1, 1, 0, 0, 0));
    let f = fire(&s, utc(2026, 1, 1, 0, 0, 0), GRACE);
    assert_eq!(
        f.occurrences,
        [utc(2020, 1, 1, 0, 0, 0)],
        "the missed one, once"
    );
    assert_eq!(f.next_at, NEVER);
    assert_eq!(s.local_time(NEVER), None);
}

#[test]
fn the_columns_round_trip() {
    for m in [Missed::Skip, Missed::Once, Missed::Each { cap: 7 }] {
        let (p, c) = m.columns();
        assert_eq!(Missed::from_columns(p, c).unwrap(), m);
    }
    for c in [
        Cadence::Every(Duration::from_secs(90)),
        Cadence::Cron(CronExpr::parse("*/5 * * * *").unwrap()),
    ] {
        let (cron, ms) = c.columns();
        assert_eq!(Cadence::from_columns(cron, ms).unwrap(), c);
    }
    let s = every(10, Millis(0), Missed::Once);
    let e = s.occurrence_event(Millis(20 * S));
    assert_eq!(e.idempotency_key.as_deref(), Some("schedule:nightly:20000"));
    assert_eq!(e.run_at, crate::model::RunAt::At(Millis(20 * S)));
}

#[test]
fn a_missed_occurrence_moved_by_the_gap_is_found_looking_back() {
    // Down over the gap day; `once` emits its 02:30-that-was-03:00.
    let mut s = cron_in("0 30 2 * * *", "America/New_York", utc(2026, 3, 8, 7, 0, 0));
    let tz = s.timezone;
    assert_eq!(
        s.cadence.prev_before(tz, utc(2026, 3, 8, 8, 0, 0)),
        Some(utc(2026, 3, 8, 7, 0, 0))
    );
    s.missed = Missed::Once;
    let f = fire(&s, utc(2026, 3, 8, 12, 0, 0), GRACE);
    assert_eq!(f.occurrences, [utc(2026, 3, 8, 7, 0, 0)]);
    assert!(!f.dropped_missed);
    assert_eq!(f.next_at, utc(2026, 3, 9, 6, 30, 0));
}
