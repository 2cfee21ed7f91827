// herald benchmark peer: pg-boss (Node.js). Follows the contract in
// ../README.md.
//
//   node main.mjs --url URL --scenario drain|latency|idle [--events N]
//       [--backlog N] [--rate R] [--seconds S] [--hook CMD]
//
// Logs go to stderr; the last stdout line is the JSON result.

import { spawn, spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";

import PgBoss from "pg-boss";
import pg from "pg";

const require = createRequire(import.meta.url);
const SYSTEM = "pg-boss";
const VERSION = require("pg-boss/package.json").version;

// ---- knobs (see README.md for the documentation behind each value) ----
const KNOBS = {
  workers: 2, // boss.work() calls on the queue (each call adds one polling worker)
  batch_size: 10000, // work({ batchSize }): jobs fetched (and handed over) per poll
  polling_interval_seconds: 0.5, // work({ pollingIntervalSeconds })
  pool_max: 10, // new PgBoss({ max }): the workers' pool
  insert_chunk: 10000, // jobs per boss.insert() call (bulk insert, untimed)
  producer_pool_max: 32, // pg pool behind send()/insert() ({ db }), = max in flight
  analyze_after_insert: true, // drain: ANALYZE the job table once the runnable jobs are stored (untimed)
  max_in_flight: 32, // latency: concurrent boss.send() calls at most
};
const QUEUE = "noop";
const DRAIN_TIMEOUT_MS = 600_000;
const LATENCY_GRACE_MS = 60_000;
const IDLE_WARMUP_MS = 5_000;

// ---- helpers ----
const log = (...a) => console.error(`[${SYSTEM}]`, ...a);
const nowUs = () => (performance.timeOrigin + performance.now()) * 1000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function fail(msg) {
  console.error(`[${SYSTEM}] error: ${msg}`);
  process.exit(1);
}

function parseCli() {
  const { values } = parseArgs({
    options: {
      url: { type: "string" },
      scenario: { type: "string" },
      events: { type: "string", default: "200000" },
      backlog: { type: "string", default: "0" },
      rate: { type: "string", default: "1000" },
      seconds: { type: "string" },
      hook: { type: "string" },
    },
    strict: true,
  });
  if (!values.url) fail("--url is required");
  if (!["drain", "latency", "idle"].includes(values.scenario))
    fail("--scenario must be drain, latency or idle");
  const int = (name, v) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < 0) fail(`--${name} must be a non-negative integer`);
    return n;
  };
  const num = (name, v) => {
    const n = Number(v);
    if (!Number.isFinite(n) || n <= 0) fail(`--${name} must be a positive number`);
    return n;
  };
  const defaultSeconds = values.scenario === "idle" ? 60 : 20;
  return {
    url: values.url,
    scenario: values.scenario,
    events: int("events", values.events),
    backlog: int("backlog", values.backlog),
    rate: num("rate", values.rate),
    seconds: num("seconds", values.seconds ?? String(defaultSeconds)),
    hook: values.hook,
  };
}

function hookEnv() {
  return { ...process.env, PEER_PID: String(process.pid) };
}

// Runs `sh -c "CMD PHASE"` and waits for it. The hook's stdout goes to our
// stderr so that stdout carries only the JSON result.
function hookSync(hook, phase) {
  if (!hook) return;
  log(`hook ${phase}`);
  const r = spawnSync("sh", ["-c", `${hook} ${phase}`], {
    stdio: ["ignore", 2, 2],
    env: hookEnv(),
  });
  if (r.error) fail(`hook ${phase}: ${r.error.message}`);
  if (r.status !== 0) fail(`hook ${phase} exited with ${r.status ?? r.signal}`);
}

// Runs the hook in the background; returns a promise for its end.
function hookBackground(hook, phase) {
  if (!hook) return Promise.resolve();
  log(`hook ${phase} (background)`);
  return new Promise((resolve, reject) => {
    const child = spawn("sh", ["-c", `${hook} ${phase}`], {
      stdio: ["ignore", 2, 2],
      env: hookEnv(),
    });
    child.on("error", (e) => reject(new Error(`hook ${phase}: ${e.message}`)));
    child.on("exit", (code, signal) =>
      code === 0 ? resolve() : reject(new Error(`hook ${phase} exited with ${code ?? signal}`)),
    );
  });
}

function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[Math.min(rank, sorted.length) - 1];
}

const round = (x, d = 3) => (x == null ? null : Math.round(x * 10 ** d) / 10 ** d);

// ---- main ----
async function main() {
  const cli = parseCli();
  log(`version ${VERSION}, scenario ${cli.scenario}`, JSON.stringify(KNOBS));

  const boss = new PgBoss({ connectionString: cli.url, max: KNOBS.pool_max });
  boss.on("error", (e) => fail(`pg-boss: ${e?.message ?? e}`));
  await boss.start(); // installs pg-boss's schema (migrate: true by default)
  await boss.createQueue(QUEUE); // v10: a queue must exist before send/work

  // Producer side: its own pool, handed to send()/insert() as their `db`,
  // so inserts do not queue behind the workers.
  const producerPool = new pg.Pool({ connectionString: cli.url, max: KNOBS.producer_pool_max });
  producerPool.on("error", (e) => fail(`producer pool: ${e.message}`));
  producerPool.on("connect", (client) =>
    client.on("error", (e) => fail(`producer connection: ${e.message}`)),
  );
  const db = { executeSql: (text, values) => producerPool.query(text, values) };

  // Backlog: a day ahead, never runnable during the run.
  if (cli.backlog > 0) {
    const startAfter = new Date(Date.now() + 24 * 3600 * 1000);
    await bulkInsert(boss, db, cli.backlog, () => ({ name: QUEUE, data: {}, startAfter }));
    log(`stored backlog of ${cli.backlog}`);
  }

  // Completion accounting, in the handler (one call per fetched batch).
  let completed = 0;
  let target = Infinity;
  let half = Infinity;
  let onHalf = null;
  let onAll = null;
  const latenciesUs = [];
  let recordLatency = false;

  const handler = async (jobs) => {
    const startUs = nowUs();
    if (recordLatency) {
      for (const job of jobs) {
        if (job.data && typeof job.data.t === "number") latenciesUs.push(startUs - job.data.t);
      }
    }
    completed += jobs.length;
    if (completed >= half && onHalf) {
      const f = onHalf;
      onHalf = null;
      f();
    }
    if (completed >= target && onAll) {
      const f = onAll;
      onAll = null;
      f();
    }
  };

  const startWorkers = async () => {
    for (let i = 0; i < KNOBS.workers; i++) {
      await boss.work(
        QUEUE,
        { batchSize: KNOBS.batch_size, pollingIntervalSeconds: KNOBS.polling_interval_seconds },
        handler,
      );
    }
  };
  const stopAll = async ({ report = false } = {}) => {
    await boss.stop({ graceful: true, wait: true });
    if (report) {
      const { rows } = await producerPool.query(
        "SELECT count(*) FILTER (WHERE state < 'active' AND start_after <= now()) AS runnable, " +
          "count(*) FILTER (WHERE state = 'active') AS active, " +
          "count(*) FILTER (WHERE state = 'completed') AS completed, count(*) AS total FROM pgboss.job",
      );
      const r = rows[0];
      log(`left in the table: ${r.runnable} runnable, ${r.active} active, ${r.completed} completed, ${r.total} in all`);
    }
    await producerPool.end();
  };

  let result;
  if (cli.scenario === "drain") {
    hookSync(cli.hook, "after-backlog");
    await bulkInsert(boss, db, cli.events, () => ({ name: QUEUE, data: {} }));
    log(`stored ${cli.events} runnable jobs`);
    // As the skip-locked baseline does: planner statistics that know the
    // table is full (autovacuum may be off, or not yet round to it).
    if (KNOBS.analyze_after_insert) await producerPool.query("ANALYZE pgboss.job");
    hookSync(cli.hook, "drain-start");

    target = cli.events;
    half = Math.max(1, Math.floor(cli.events / 2));
    let midDrain = Promise.resolve();
    onHalf = () => {
      midDrain = hookBackground(cli.hook, "mid-drain");
      midDrain.catch(() => {}); // awaited below
    };
    const allDone = new Promise((resolve) => (onAll = resolve));
    if (cli.events === 0) {
      onHalf();
      onHalf = null;
      onAll();
    }

    const t0 = performance.now();
    await startWorkers();
    const progress = setInterval(
      () => log(`progress: ${completed}/${cli.events} after ${((performance.now() - t0) / 1000).toFixed(1)} s`),
      5000,
    );
    let timer;
    const timedOut = new Promise((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`drain did not finish in 600 s (${completed}/${cli.events} ran)`)),
        DRAIN_TIMEOUT_MS,
      );
    });
    try {
      await Promise.race([allDone, timedOut]);
    } catch (e) {
      fail(e.message);
    }
    const seconds = (performance.now() - t0) / 1000;
    clearTimeout(timer);
    clearInterval(progress);
    try {
      await midDrain;
    } catch (e) {
      fail(e.message);
    }
    hookSync(cli.hook, "drain-end");
    log(`drained ${completed} in ${seconds.toFixed(3)} s`);
    await stopAll({ report: true });
    result = {
      system: SYSTEM,
      version: VERSION,
      scenario: "drain",
      events: cli.events,
      backlog: cli.backlog,
      seconds: round(seconds),
      events_per_s: round(cli.events / seconds, 1),
      knobs: KNOBS,
    };
  } else if (cli.scenario === "latency") {
    recordLatency = true;
    await startWorkers();
    hookSync(cli.hook, "run-start");

    const offered = Math.round(cli.rate * cli.seconds);
    target = offered;
    const allDone = new Promise((resolve) => (onAll = resolve));
    if (offered === 0) onAll();

    let inFlight = 0;
    let slotFree = null;
    let insertError = null;
    const intervalMs = 1000 / cli.rate;
    const t0 = performance.now();
    for (let i = 0; i < offered; i++) {
      const due = t0 + i * intervalMs;
      const wait = due - performance.now();
      if (wait >= 1) await sleep(wait);
      while (inFlight >= KNOBS.max_in_flight) await new Promise((r) => (slotFree = r));
      if (insertError) fail(`send: ${insertError.message}`);
      inFlight++;
      boss
        .send(QUEUE, { t: nowUs() }, { db })
        .catch((e) => (insertError ??= e))
        .finally(() => {
          inFlight--;
          if (slotFree) {
            const f = slotFree;
            slotFree = null;
            f();
          }
        });
    }
    while (inFlight > 0) await new Promise((r) => (slotFree = r));
    if (insertError) fail(`send: ${insertError.message}`);
    const offerSeconds = (performance.now() - t0) / 1000;
    await Promise.race([allDone, sleep(LATENCY_GRACE_MS)]);
    if (completed < offered) log(`warning: only ${completed}/${offered} ran within 60 s of the end of offering`);
    hookSync(cli.hook, "run-end");
    await stopAll();

    const sorted = latenciesUs.map((us) => us / 1000).sort((a, b) => a - b);
    result = {
      system: SYSTEM,
      version: VERSION,
      scenario: "latency",
      events: offered,
      backlog: cli.backlog,
      seconds: round(offerSeconds),
      events_per_s: round(offered / offerSeconds, 1),
      knobs: KNOBS,
      offered,
      completed,
      rate: cli.rate,
      achieved_rate: round(offered / offerSeconds, 1),
      latency_ms: {
        p50: round(percentile(sorted, 50)),
        p99: round(percentile(sorted, 99)),
        max: round(sorted.length ? sorted[sorted.length - 1] : null),
      },
    };
  } else {
    await startWorkers();
    await sleep(IDLE_WARMUP_MS);
    hookSync(cli.hook, "idle-start");
    const t0 = performance.now();
    await sleep(cli.seconds * 1000);
    const seconds = (performance.now() - t0) / 1000;
    hookSync(cli.hook, "idle-end");
    await stopAll();
    result = {
      system: SYSTEM,
      version: VERSION,
      scenario: "idle",
      events: 0,
      backlog: cli.backlog,
      seconds: round(seconds),
      events_per_s: 0,
      knobs: KNOBS,
    };
  }

  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(0);
}

// Bulk insert with boss.insert(), in chunks, through the producer pool.
async function bulkInsert(boss, db, n, make) {
  for (let done = 0; done < n; ) {
    const k = Math.min(KNOBS.insert_chunk, n - done);
    const jobs = new Array(k);
    for (let i = 0; i < k; i++) jobs[i] = make();
    await boss.insert(jobs, { db });
    done += k;
  }
}

process.on("unhandledRejection", (e) => fail(`unhandled rejection: ${e?.stack ?? e}`));
main().catch((e) => fail(e?.stack ?? String(e)));
