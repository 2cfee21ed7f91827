// herald benchmark peer: graphile-worker (Node.js), local queue and batched
// completion on, in WORKER_THREADS worker threads (graphile-worker's own
// performance test runs several worker instances side by side; one Node
// thread would leave a core idle). The contract (flags, scenarios, hooks) is
// ../contract/contract.mjs; README.md gives every knob and its source.

import { createRequire } from "node:module";
import { Worker, isMainThread, parentPort, workerData } from "node:worker_threads";

import { Logger, makeWorkerUtils, run } from "graphile-worker";
import pg from "pg";

import { runPeer, threadTally } from "../contract/contract.mjs";

const require = createRequire(import.meta.url);
const SYSTEM = "graphile-worker-js";
const TASK = "noop";
const KNOBS = {
  worker_threads: Number(process.env.GRAPHILE_WORKER_THREADS ?? 2), // run() instances, one thread each
  concurrency: 24, // preset.worker.concurrentJobs, per instance
  max_pool_size: 25, // preset.worker.maxPoolSize, per instance
  poll_interval_ms: 2000, // preset.worker.pollInterval
  local_queue_size: 500, // preset.worker.localQueue.size
  local_queue_refetch_delay_ms: 10, // preset.worker.localQueue.refetchDelay.durationMs
  complete_job_batch_delay_ms: 0, // preset.worker.completeJobBatchDelay
  fail_job_batch_delay_ms: 0, // preset.worker.failJobBatchDelay
  producer_pool_max: 32, // pg pool behind WorkerUtils (inserts), = max in flight
  bulk_insert: "WorkerUtils.addJobs",
  latency_insert: "WorkerUtils.addJob",
  // Not set: a dead worker's jobs stay locked until a live runner's
  // resetLockedAt (0.17.3 dist/sql/resetLockedAt.js, run every
  // minResetLockedInterval..maxResetLockedInterval, 8-10 min) unlocks those
  // locked more than 4 hours ago (hard-coded).
  rescue_after_s: 4 * 3600,
  rescue_setting: "graphile-worker resetLockedAt: locked_at older than 4 hours (fixed), checked every 8-10 min (minResetLockedInterval/maxResetLockedInterval defaults)",
};
/** How often a worker thread reports its runs to the main thread. */
const REPORT_EVERY_MS = 2;

// graphile-worker logs through this, to stderr, warnings and errors only: at
// "info" it writes a line per completed job, which would cost the peer more
// CPU than the no-op handler itself.
const logger = new Logger((scope) => (level, message) => {
  if (level !== "error" && level !== "warning") return;
  console.error(`[${SYSTEM}] ${level}${scope.label ? ` ${scope.label}` : ""}: ${message}`);
});

/** One worker thread: a graphile-worker runner whose task reports each job
 * (the contract's threadTally), posted to the main thread in small batches. */
async function workerThread({ url, tally: spec }) {
  const tally = threadTally(spec);
  const taskList = {
    [TASK]: async (payload) => {
      tally.ran(payload?.seq ?? 0, payload?.t_us ?? 0);
      await tally.work();
    },
  };
  const flush = () => {
    const ran = tally.take();
    if (ran) parentPort.postMessage({ ran });
  };
  const timer = setInterval(flush, REPORT_EVERY_MS);
  const runner = await run({
    preset: {
      worker: {
        connectionString: url,
        concurrentJobs: KNOBS.concurrency,
        maxPoolSize: KNOBS.max_pool_size,
        pollInterval: KNOBS.poll_interval_ms,
        localQueue: { size: KNOBS.local_queue_size, refetchDelay: { durationMs: KNOBS.local_queue_refetch_delay_ms } },
        completeJobBatchDelay: KNOBS.complete_job_batch_delay_ms,
        failJobBatchDelay: KNOBS.fail_job_batch_delay_ms,
        logger,
      },
    },
    taskList,
  });
  const fatal = (why) => parentPort.postMessage({ fatal: String(why) });
  runner.events.on("worker:fatalError", ({ error }) => fatal(`worker fatal error: ${error?.message ?? error}`));
  runner.promise.catch((e) => fatal(`runner: ${e?.message ?? e}`));
  parentPort.postMessage({ started: true });
  parentPort.on("message", async (msg) => {
    if (msg !== "stop") return;
    await runner.stop(); // flushes the batched completions
    clearInterval(timer);
    flush();
    parentPort.postMessage({ stopped: true });
  });
}

async function install(url, tally) {
  // The inserts' own pool, so they do not queue behind the workers'.
  const producerPool = new pg.Pool({ connectionString: url, max: KNOBS.producer_pool_max });
  producerPool.on("error", (e) => tally.fail(`producer pool: ${e.message}`));
  producerPool.on("connect", (client) => client.on("error", (e) => tally.fail(`producer connection: ${e.message}`)));
  const utils = await makeWorkerUtils({ pgPool: producerPool, logger });
  await utils.migrate();
  let threads = [];
  return {
    async store(from, to, due) {
      const runAt = due === "in-a-day" ? new Date(Date.now() + 24 * 3600 * 1000) : undefined;
      const specs = [];
      for (let seq = from; seq < to; seq++) specs.push({ identifier: TASK, payload: { seq, t_us: 0 }, runAt });
      await utils.addJobs(specs);
    },
    async start() {
      threads = Array.from({ length: KNOBS.worker_threads }, () => {
        const thread = new Worker(new URL(import.meta.url), { workerData: { url, tally: tally.spec() } });
        const started = new Promise((resolve) => {
          thread.on("message", (msg) => {
            if (msg.ran) tally.add(msg.ran);
            else if (msg.fatal) tally.fail(msg.fatal);
            else if (msg.started) resolve();
            else if (msg.stopped) thread.emit("stopped");
          });
        });
        thread.on("error", (e) => tally.fail(`worker thread: ${e?.stack ?? e}`));
        return { thread, started };
      });
      await Promise.race([Promise.all(threads.map((t) => t.started)), tally.failed]);
    },
    insert: (job) => utils.addJob(TASK, job),
    async stop() {
      await Promise.all(
        threads.map(async ({ thread }) => {
          const stopped = new Promise((resolve) => thread.once("stopped", resolve));
          thread.postMessage("stop");
          await stopped;
          await thread.terminate();
        }),
      );
    },
    async leftRunnable() {
      const { rows } = await producerPool.query(
        "SELECT count(*)::int AS n FROM graphile_worker._private_jobs WHERE run_at <= now()",
      );
      return rows[0].n;
    },
    async close() {
      await utils.release();
      await producerPool.end();
    },
  };
}

if (isMainThread) {
  runPeer({ system: SYSTEM, version: require("graphile-worker/package.json").version, knobs: KNOBS, install });
} else {
  workerThread(workerData).catch((e) => parentPort.postMessage({ fatal: e?.stack ?? String(e) }));
}
