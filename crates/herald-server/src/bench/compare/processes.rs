//! PostgreSQL's CPU process by process: the `pg-cpu.PHASE` files that
//! `bench/lib/mark.sh` writes at a run's timed ends, read for what the
//! run's own connections spent between them (not autovacuum, the
//! checkpointer, the WAL writer or the hook's own `psql`).

use std::collections::BTreeMap;

/// Clock ticks per second of `/proc/PID/stat` when a file does not say
/// (mark.sh writes `# hz N`, `getconf CLK_TCK`, first; files of the first
/// runs that recorded processes lack it): 100 on every Linux here.
const DEFAULT_HZ: f64 = 100.0;

/// The CPU, in ms, that the client connections spent from `start` to
/// `end` (the two files' text): for each connection alive at the end, its
/// ticks less those it had at the start (all of them for one opened in
/// between, as a worker's pool is). None when either file holds no
/// process at all.
pub(super) fn connections_ms(start: &str, end: &str) -> Option<f64> {
    let (before, _) = connections(start)?;
    let (after, hz) = connections(end)?;
    let ticks: f64 = after
        .iter()
        .map(|(pid, t)| t - before.get(pid).copied().unwrap_or(0.0))
        .sum();
    Some(ticks * 1000.0 / hz)
}

/// The client connections' ticks by PID, and the file's clock rate.
fn connections(text: &str) -> Option<(BTreeMap<u32, f64>, f64)> {
    let mut hz = DEFAULT_HZ;
    let mut found = false;
    let mut ticks = BTreeMap::new();
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("# hz ") {
            hz = n.trim().parse().unwrap_or(DEFAULT_HZ);
            continue;
        }
        let mut parts = line.splitn(3, ' ');
        let (Some(pid), Some(t), Some(title)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(pid), Ok(t)) = (pid.parse::<u32>(), t.parse::<f64>()) else {
            continue;
        };
        found = true;
        if is_connection(title) {
            ticks.insert(pid, t);
        }
    }
    found.then_some((ticks, hz))
}

/// A backend serving a client: titled `postgres: USER DATABASE HOST(PORT)
/// …` (or `[local]` for a socket), where the server's own processes are
/// `postgres: checkpointer`, `postgres: autovacuum worker DB`, … and
/// another cluster's carry its name (`postgres: 15/main: …`).
fn is_connection(title: &str) -> bool {
    let Some(rest) = title.strip_prefix("postgres: ") else {
        return false;
    };
    let words: Vec<&str> = rest.split_whitespace().collect();
    match words.as_slice() {
        [user, _, host, ..] => !user.ends_with(':') && (host.contains('(') || *host == "[local]"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: &str = "\
700 5 /usr/lib/postgresql/15/bin/postgres -D /tmp/c/db
700 76 exited children
701 9 postgres: checkpointer
705 3 postgres: autovacuum worker bench_x
800 40 postgres: postgres bench_x 127.0.0.1(5001) idle
900 23 postgres: 15/main: postgres test 127.0.0.1(6000) idle
";

    const END: &str = "\
700 6 /usr/lib/postgresql/15/bin/postgres -D /tmp/c/db
700 95 exited children
701 30 postgres: checkpointer
705 60 postgres: autovacuum worker bench_x
800 52 postgres: postgres bench_x 127.0.0.1(5001) idle
801 250 postgres: postgres bench_x 127.0.0.1(5002) idle in transaction
802 7 postgres: postgres bench_x [local] idle
900 99 postgres: 15/main: postgres test 127.0.0.1(6000) idle
";

    #[test]
    fn only_the_client_connections_of_this_cluster_count() {
        // 800: 12 ticks since the start; 801 and 802 opened since: 257.
        assert_eq!(connections_ms(START, END), Some(2690.0));
    }

    #[test]
    fn the_file_may_name_its_clock_rate_and_an_empty_file_gives_nothing() {
        let end = format!("# hz 1000\n{END}");
        assert_eq!(connections_ms(START, &end), Some(269.0));
        assert_eq!(connections_ms("", END), None);
    }
}
