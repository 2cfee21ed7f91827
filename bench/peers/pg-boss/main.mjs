// herald benchmark peer: pg-boss (Node.js). The contract (flags, scenarios,
// hooks) is ../contract/contract.mjs; README.md gives every knob and its
// source.

import { createRequire } from "node:module";

import PgBoss from "pg-boss";
import pg from "pg";

import { runPeer } from "../contract/contract.mjs";

const require = createRequire(import.meta.url);
const QUEUE = "noop";
const KNOBS = {
  workers: 2, // boss.work() calls on the queue (each call adds one polling worker)
  batch_size: 10000, // work({ batchSize }): jobs fetched (and handed over) per poll
  polling_interval_seconds: 0.5, // work({ pollingIntervalSeconds })
  pool_max: 10, // new PgBoss({ max }): the workers' pool
  producer_pool_max: 32, // pg pool behind send()/insert() ({ db }), = max in flight
  bulk_insert: "boss.insert",
  latency_insert: "boss.send",
  // Not set: pg-boss's defaults (10.4.2 src/plans.js, src/attorney.js). An
  // active job older than its expire_in (default 15 min) is failed by the
  // maintenance (every maintenanceIntervalSeconds, default 120 s) and, with
  // retries left (retryLimit default 2), retried at once (retryDelay 0).
  rescue_after_s: 900,
  rescue_setting: "pg-boss expireInSeconds default 900, expired by maintenance every maintenanceIntervalSeconds (default 120), then retried (retryLimit default 2)",
};

async function install(url, tally) {
  const boss = new PgBoss({ connectionString: url, max: KNOBS.pool_max });
  boss.on("error", (e) => tally.fail(`pg-boss: ${e?.message ?? e}`));
  await boss.start(); // installs pg-boss's schema (migrate: true by default)
  await boss.createQueue(QUEUE); // v10: a queue must exist before send/work
  // The inserts' own pool, handed to send()/insert() as their documented
  // `db`, so they do not queue behind the workers.
  const producerPool = new pg.Pool({ connectionString: url, max: KNOBS.producer_pool_max });
  producerPool.on("error", (e) => tally.fail(`producer pool: ${e.message}`));
  producerPool.on("connect", (client) => client.on("error", (e) => tally.fail(`producer connection: ${e.message}`)));
  const db = { executeSql: (text, values) => producerPool.query(text, values) };
  // One call per fetched batch: each job is reported, then the batch's jobs
  // work together (one tally.work(): the same time as each working at once).
  const handler = async (jobs) => {
    for (const job of jobs) tally.ran(job.data?.seq ?? 0, job.data?.t_us ?? 0);
    await tally.work();
  };
  return {
    async store(from, to, due) {
      const startAfter = due === "in-a-day" ? new Date(Date.now() + 24 * 3600 * 1000) : undefined;
      const jobs = [];
      for (let seq = from; seq < to; seq++) jobs.push({ name: QUEUE, data: { seq, t_us: 0 }, startAfter });
      await boss.insert(jobs, { db });
    },
    async start() {
      for (let i = 0; i < KNOBS.workers; i++) {
        await boss.work(
          QUEUE,
          { batchSize: KNOBS.batch_size, pollingIntervalSeconds: KNOBS.polling_interval_seconds },
          handler,
        );
      }
    },
    insert: (job) => boss.send(QUEUE, job, { db }),
    stop: () => boss.stop({ graceful: true, wait: true }),
    async leftRunnable() {
      const { rows } = await producerPool.query(
        "SELECT count(*)::int AS n FROM pgboss.job WHERE state < 'active' AND start_after <= now()",
      );
      return rows[0].n;
    },
    close: () => producerPool.end(),
  };
}

runPeer({ system: "pg-boss", version: require("pg-boss/package.json").version, knobs: KNOBS, install });
