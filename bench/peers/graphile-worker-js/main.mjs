// herald benchmark peer: graphile-worker (Node.js), local queue and batched
// completion on. Follows the contract in ../README.md.
//
//   node main.mjs --url URL --scenario drain|latency|idle [--events N]
//       [--backlog N] [--rate R] [--seconds S] [--hook CMD]
//
// Logs go to stderr; the last stdout line is the JSON result.

import { spawn, spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";

import { Logger, makeWorkerUtils, run } from "graphile-worker";
import pg from "pg";

const require = createRequire(import.meta.url);
const SYSTEM = "graphile-worker-js";
const VERSION = require("graphile-worker/package.json").version;

// ---- knobs (see README.md for the documentation behind each value) ----
const KNOBS = {
  concurrency: 24, // preset.worker.concurrentJobs
  max_pool_size: 25, // preset.worker.maxPoolSize
  poll_interval_ms: 2000, // preset.worker.pollInterval
  local_queue_size: 500, // preset.worker.localQueue.size
  complete_job_batch_delay_ms: 0, // preset.worker.completeJobBatchDelay
  fail_job_batch_delay_ms: 0, // preset.worker.failJobBatchDelay
  add_jobs_chunk: 10000, // jobs per addJobs() call (bulk insert, untimed)
  producer_pool_max: 32, // pg pool behind WorkerUtils (inserts), = max in flight
  analyze_after_insert: true, // drain: ANALYZE the job table once the runnable jobs are stored (untimed)
  max_in_flight: 32, // latency: concurrent addJob() calls at most
};
const TASK = "noop";
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

// graphile-worker logs through this, to stderr. Only warnings and errors:
// at "info" it writes a line per completed job, which would cost the peer
// more CPU than the no-op handler itself.
const logger = new Logger((scope) => (level, message) => {
  if (level !== "error" && level !== "warning") return;
  console.error(`[${SYSTEM}] ${level}${scope.label ? ` ${scope.label}` : ""}: ${message}`);
});

// ---- main ----
async function main() {
  const cli = parseCli();
  log(`version ${VERSION}, scenario ${cli.scenario}`, JSON.stringify(KNOBS));

  const workerPreset = {
    worker: {
      connectionString: cli.url,
      concurrentJobs: KNOBS.concurrency,
      maxPoolSize: KNOBS.max_pool_size,
      pollInterval: KNOBS.poll_interval_ms,
      localQueue: { size: KNOBS.local_queue_size },
      completeJobBatchDelay: KNOBS.complete_job_batch_delay_ms,
      failJobBatchDelay: KNOBS.fail_job_batch_delay_ms,
      logger,
    },
  };

  // Producer side: its own pool, so inserts do not queue behind the workers.
  const producerPool = new pg.Pool({ connectionString: cli.url, max: KNOBS.producer_pool_max });
  producerPool.on("error", (e) => fail(`producer pool: ${e.message}`));
  producerPool.on("connect", (client) =>
    client.on("error", (e) => fail(`producer connection: ${e.message}`)),
  );
  const utils = await makeWorkerUtils({ pgPool: producerPool, logger });
  await utils.migrate(); // installs graphile-worker's schema

  // Backlog: a day ahead, never runnable during the run.
  if (cli.backlog > 0) {
    const runAt = new Date(Date.now() + 24 * 3600 * 1000);
    await bulkAdd(utils, cli.backlog, () => ({ identifier: TASK, payload: {}, runAt }));
    log(`stored backlog of ${cli.backlog}`);
  }

  // Completion accounting, in the handler.
  let completed = 0;
  let target = Infinity;
  let half = Infinity;
  let onHalf = null;
  let onAll = null;
  const latenciesUs = [];
  let recordLatency = false;

  const taskList = {
    [TASK]: async (payload) => {
      const startUs = nowUs();
      if (recordLatency && payload && typeof payload.t === "number") {
        latenciesUs.push(startUs - payload.t);
      }
      completed++;
      if (completed === half && onHalf) onHalf();
      if (completed >= target && onAll) {
        const f = onAll;
        onAll = null;
        f();
      }
    },
  };

  let runner = null;
  const startWorkers = async () => {
    runner = await run({ preset: workerPreset, taskList });
    runner.events.on("worker:fatalError", ({ error }) =>
      fail(`worker fatal error: ${error?.message ?? error}`),
    );
    runner.promise.catch((e) => fail(`runner: ${e?.message ?? e}`));
  };
  const stopAll = async ({ report = false } = {}) => {
    if (runner) await runner.stop();
    if (report) {
      const { rows } = await producerPool.query(
        "SELECT count(*) FILTER (WHERE run_at <= now()) AS runnable, count(*) AS total FROM graphile_worker._private_jobs",
      );
      log(`left in the table: ${rows[0].runnable} runnable, ${rows[0].total} in all`);
    }
    await utils.release();
    await producerPool.end();
  };

  let result;
  if (cli.scenario === "drain") {
    hookSync(cli.hook, "after-backlog");
    await bulkAdd(utils, cli.events, () => ({ identifier: TASK, payload: {} }));
    log(`stored ${cli.events} runnable jobs`);
    // As the skip-locked baseline does: planner statistics that know the
    // table is full (autovacuum may be off, or not yet round to it).
    if (KNOBS.analyze_after_insert) await producerPool.query("ANALYZE graphile_worker._private_jobs, graphile_worker._private_job_queues, graphile_worker._private_tasks");
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
      if (insertError) fail(`addJob: ${insertError.message}`);
      inFlight++;
      utils
        .addJob(TASK, { t: nowUs() })
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
    if (insertError) fail(`addJob: ${insertError.message}`);
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

// Bulk insert with addJobs(), in chunks.
async function bulkAdd(utils, n, make) {
  for (let done = 0; done < n; ) {
    const k = Math.min(KNOBS.add_jobs_chunk, n - done);
    const specs = new Array(k);
    for (let i = 0; i < k; i++) specs[i] = make();
    await utils.addJobs(specs);
    done += k;
  }
}

process.on("unhandledRejection", (e) => fail(`unhandled rejection: ${e?.stack ?? e}`));
main().catch((e) => fail(e?.stack ?? String(e)));
