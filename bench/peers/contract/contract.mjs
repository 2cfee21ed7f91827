// The Node.js peers' side of the contract in ../README.md (the Rust peers'
// is src/, the peer-contract crate): the flags, the scenarios (drain,
// latency, idle, long-horizon, rescue), the hooks, the paced producer, the
// percentiles and the result line, once, so each peer only says how its
// system installs, stores, starts, inserts and stops.
//
//   import { runPeer } from "../contract/contract.mjs";
//   runPeer({ system, version, knobs, install });
//
// `install(url, tally)` runs the system's migrations (idempotently: the
// rescue's rescuer finds the victim's schema in place) and returns
//   { store(from, to, due), start(), insert(job), stop(), leftRunnable?(), close?() }
// where `due` is "now" or "in-a-day", `job` is { seq, t_us }, and the
// system's handler calls `tally.ran(job.seq, job.t_us)` first thing for each
// job, then `await tally.work()` (the long horizon's --work-ms, forever in
// the rescue's victim, nothing otherwise). A handler in a worker thread uses
// `threadTally(tally.spec())` there and hands its `take()` to `tally.add()`.
// `knobs` include `rescue_after_s` and `rescue_setting` (see ../README.md).
// Logs go to stderr; the last stdout line is the JSON result.

import { spawn } from "node:child_process";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";

const DRAIN_LIMIT_MS = 600_000;
const LATENCY_GRACE_MS = 60_000;
const IN_FLIGHT = 32;
const IDLE_WARMUP_MS = 5_000;
const STORE_CHUNK = 5_000;
const SETTLE_MS = 1_000;
const VICTIM_STEADY_MS = 1_000;
const VICTIM_LIMIT_MS = 600_000;

/** Epoch microseconds, the clock both ends of a latency sample read. */
export const epochMicros = () => Math.round((performance.timeOrigin + performance.now()) * 1000);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const round3 = (x) => (x == null ? null : Math.round(x * 1000) / 1000);

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
      "work-ms": { type: "string", default: "1" },
      window: { type: "string", default: "10" },
      role: { type: "string" },
      "killed-at": { type: "string" },
      timeout: { type: "string", default: "120" },
    },
    strict: true,
  });
  if (!values.url) throw new Error("--url is required");
  if (!["drain", "latency", "idle", "long-horizon", "rescue"].includes(values.scenario))
    throw new Error("--scenario must be drain, latency, idle, long-horizon or rescue");
  if (values.scenario === "rescue" && !["victim", "rescuer"].includes(values.role))
    throw new Error("--scenario rescue needs --role victim|rescuer");
  const number = (name, ok, what) => {
    const n = Number(values[name]);
    if (!Number.isFinite(n) || !ok(n)) throw new Error(`--${name} must be ${what}`);
    return n;
  };
  const count = (name) => {
    const n = Number(values[name]);
    if (!Number.isInteger(n) || n < 0) throw new Error(`--${name} must be a non-negative integer`);
    return n;
  };
  const defaultSeconds = { idle: 60, "long-horizon": 600 }[values.scenario] ?? 20;
  const seconds = Number(values.seconds ?? defaultSeconds);
  if (!Number.isFinite(seconds) || seconds < 0) throw new Error("--seconds must be a number >= 0");
  const rescuer = values.scenario === "rescue" && values.role === "rescuer";
  if (rescuer && values["killed-at"] == null) throw new Error("--role rescuer needs --killed-at EPOCH_MS");
  return {
    url: values.url,
    scenario: values.scenario,
    events: count("events"),
    backlog: count("backlog"),
    rate: count("rate"),
    seconds,
    hook: values.hook,
    workMs: number("work-ms", (n) => n >= 0, "a number >= 0"),
    window: number("window", (n) => n > 0, "a positive number"),
    role: values.role,
    killedAt: rescuer ? number("killed-at", (n) => Number.isInteger(n), "epoch milliseconds") : null,
    timeout: number("timeout", (n) => n > 0, "a positive number"),
  };
}

/** Runs `sh -c "CMD PHASE"`; resolves when it ends well. Its stdout goes to
 * our stderr, so stdout carries only the result. */
function hook(cmd, phase) {
  if (!cmd) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const child = spawn("sh", ["-c", `${cmd} ${phase}`], { stdio: ["ignore", 2, 2] });
    child.on("error", (e) => reject(new Error(`hook ${phase}: ${e.message}`)));
    child.on("exit", (code, signal) =>
      code === 0 ? resolve() : reject(new Error(`the hook for phase ${phase} exited with ${code ?? signal}`)),
    );
  });
}

/** The handler's work after its start, for a mode of the Tally: `--work-ms`
 * in the long horizon ("work"), never ending in the rescue's victim. */
function makeWork({ mode, workMs }) {
  const done = Promise.resolve();
  if (mode === "work" && workMs > 0) return () => sleep(workMs);
  if (mode === "victim") {
    const never = new Promise(() => {});
    return () => never;
  }
  return () => done;
}

/** The handler's side of the Tally inside a worker thread: `ran` and `work`
 * as on the Tally; `take()` returns what ran since the last take (null when
 * nothing did), to post to the main thread for its `tally.add()`. */
export function threadTally(spec) {
  const record = spec.mode === "rescuer";
  let n = 0;
  let runs = []; // flat [seq, t_us, start_us, ...], for the runs that need one
  return {
    ran(seq, tUs) {
      n++;
      if (record || tUs > 0) runs.push(seq, tUs, epochMicros());
    },
    work: makeWork(spec),
    take() {
      if (n === 0) return null;
      const batch = { n, runs };
      n = 0;
      runs = [];
      return batch;
    },
  };
}

/** Runs counted by the handlers, watched by the scenario. Modes: "plain"
 * (drain, latency, idle), "work" (long-horizon), "victim" and "rescuer"
 * (rescue; the rescuer counts each job once however often it ran). */
class Tally {
  constructor(mode = "plain", workMs = 0) {
    this.mode = mode;
    this.workMs = workMs;
    this.work = makeWork({ mode, workMs });
    this.count = 0; // runs, or in the rescuer distinct jobs run
    this.starts = 0; // rescuer: every start, repeats included
    this.seen = mode === "rescuer" ? new Set() : null;
    this.firstUs = null; // rescuer: first start, epoch µs
    this.lastNewUs = null; // rescuer: last start of a job not run before
    this.latenciesUs = [];
    this.startsUs = []; // handler start of each latency sample, epoch µs
    this.waiters = []; // { n, resolve }
    this.failure = null;
    this.onFailure = null;
    this.failed = new Promise((_, reject) => (this.onFailure = reject));
    this.failed.catch(() => {});
  }
  /** What a worker thread needs for its `threadTally`. */
  spec() {
    return { mode: this.mode, workMs: this.workMs };
  }
  /** Called by the handler first thing, with the job's `seq` and `t_us`;
   * then the handler awaits `tally.work()`. */
  ran(seq, tUs) {
    this.record(seq, tUs, epochMicros());
    this.notify();
  }
  record(seq, tUs, startUs) {
    if (tUs > 0) {
      this.latenciesUs.push(startUs - tUs);
      this.startsUs.push(startUs);
    }
    if (!this.seen) return void this.count++;
    this.starts++;
    this.firstUs ??= startUs;
    if (this.seen.has(seq)) return;
    this.seen.add(seq);
    this.count++;
    if (this.lastNewUs == null || startUs > this.lastNewUs) this.lastNewUs = startUs;
  }
  /** A worker thread's `take()`: `n` runs, `runs` the flat
   * [seq, t_us, start_us, ...] of those that carry a sample or a seq to count. */
  add({ n, runs }) {
    for (let i = 0; i < runs.length; i += 3) this.record(runs[i], runs[i + 1], runs[i + 2]);
    if (!this.seen) this.count += n - runs.length / 3;
    this.notify();
  }
  notify() {
    if (this.waiters.length === 0) return;
    this.waiters = this.waiters.filter((w) => (w.n <= this.count ? (w.resolve(), false) : true));
  }
  /** A worker's failure: the scenario ends with it. */
  fail(why) {
    this.failure ??= new Error(String(why));
    this.onFailure(this.failure);
  }
  /** Resolves once `n` jobs have run, rejects on a failure or at `ms`. */
  reached(n, ms, what) {
    const reached =
      n <= this.count ? Promise.resolve() : new Promise((resolve) => this.waiters.push({ n, resolve }));
    let timer;
    const late = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: ${this.count} of ${n} jobs ran`)), ms);
    });
    return Promise.race([reached, this.failed, late]).finally(() => clearTimeout(timer));
  }
}

function percentileMs(sortedUs, q) {
  if (sortedUs.length === 0) return null;
  const rank = Math.min(Math.max(1, Math.ceil(q * sortedUs.length)), sortedUs.length);
  return round3(sortedUs[rank - 1] / 1000);
}

const percentiles = (sortedUs) => ({
  p50: percentileMs(sortedUs, 0.5),
  p99: percentileMs(sortedUs, 0.99),
  max: percentileMs(sortedUs, 1),
});

/** Windows of `windowS` seconds from `t0Us` by handler start (as the Rust
 * contract's): `{ t_s, completed, latency_ms }`, empty windows included, a
 * start before `t0Us` in the first. */
export function windows(startsUs, latenciesUs, t0Us, windowS) {
  const index = (at) => Math.floor(Math.max(0, at - t0Us) / 1e6 / windowS);
  const byWindow = [];
  startsUs.forEach((at, i) => {
    const w = index(at);
    while (byWindow.length <= w) byWindow.push([]);
    byWindow[w].push(latenciesUs[i]);
  });
  return byWindow.map((lat, i) => ({
    t_s: round3((i + 1) * windowS),
    completed: lat.length,
    latency_ms: percentiles(lat.sort((a, b) => a - b)),
  }));
}

async function store(peer, count, due) {
  for (let from = 0; from < count; from += STORE_CHUNK) {
    await peer.store(from, Math.min(from + STORE_CHUNK, count), due);
  }
}

async function drain(peer, tally, cli, log) {
  let t = performance.now();
  await store(peer, cli.backlog, "in-a-day");
  log(`${cli.backlog} backlog jobs stored in ${((performance.now() - t) / 1000).toFixed(1)} s`);
  await hook(cli.hook, "after-backlog");
  t = performance.now();
  await store(peer, cli.events, "now");
  log(`${cli.events} runnable jobs stored in ${((performance.now() - t) / 1000).toFixed(1)} s`);
  await hook(cli.hook, "drain-start");

  const t0 = performance.now();
  const what = `drain not done in ${DRAIN_LIMIT_MS / 1000} s`;
  await peer.start();
  await tally.reached(Math.ceil(cli.events / 2), DRAIN_LIMIT_MS, what);
  const mid = hook(cli.hook, "mid-drain");
  mid.catch(() => {}); // awaited below
  await tally.reached(cli.events, DRAIN_LIMIT_MS - (performance.now() - t0), what);
  const seconds = (performance.now() - t0) / 1000;
  log(`${tally.count} jobs ran in ${seconds.toFixed(3)} s`);
  // What mid-drain started (the mid-analyze case's ANALYZE) ends inside
  // the timed phases, so the readings at drain-end hold all its CPU.
  await mid;
  await hook(cli.hook, "drain-end");
  return {
    scenario: "drain",
    events: cli.events,
    backlog: cli.backlog,
    seconds: round3(seconds),
    events_per_s: seconds > 0 ? Math.round(cli.events / seconds) : 0,
  };
}

/** The latency and long-horizon runs up to `run-end`: starts the workers,
 * settles, offers, waits for the last offered job (or the grace). */
async function paced(peer, tally, cli, log) {
  if (cli.rate <= 0 || cli.seconds <= 0) throw new Error("--rate and --seconds must be positive");
  const due = Math.round(cli.rate * cli.seconds);
  await peer.start();
  // Time to reach the idle wait (LISTEN, first empty fetch) before the
  // first offer; a drain's clock has no such sleep.
  await Promise.race([sleep(SETTLE_MS), tally.failed]);
  await hook(cli.hook, "run-start");

  // One insert call per job, each started at its time, at most IN_FLIGHT at
  // once: a slow insert delays the next ones rather than piling up.
  // Offering ends with its window: a system that cannot take the rate is
  // offered fewer jobs (the achieved rate says how many), not for longer.
  let inFlight = 0;
  let slotFree = null;
  let insertError = null;
  let offered = 0;
  const t0 = performance.now();
  const t0Us = epochMicros();
  for (let seq = 0; seq < due; seq++) {
    const wait = t0 + (seq * 1000) / cli.rate - performance.now();
    if (wait >= 1) await sleep(wait);
    while (inFlight >= IN_FLIGHT) await new Promise((r) => (slotFree = r));
    if (performance.now() - t0 > cli.seconds * 1000) break;
    offered++;
    if (insertError) throw insertError;
    if (tally.failure) throw tally.failure;
    inFlight++;
    peer
      .insert({ seq, t_us: epochMicros() })
      .catch((e) => (insertError ??= e))
      .finally(() => {
        inFlight--;
        const f = slotFree;
        slotFree = null;
        if (f) f();
      });
  }
  while (inFlight > 0) await new Promise((r) => (slotFree = r));
  if (insertError) throw insertError;
  const offering = (performance.now() - t0) / 1000;
  log(`offered ${offered} jobs in ${offering.toFixed(3)} s (${(offered / offering).toFixed(1)}/s)`);
  try {
    await tally.reached(offered, LATENCY_GRACE_MS, "latency");
  } catch (e) {
    if (tally.failure) throw e;
    log(`warning: ${tally.count} of ${offered} offered jobs ran within ${LATENCY_GRACE_MS / 1000} s of offering's end`);
  }
  await hook(cli.hook, "run-end");
  return { offered, offering, t0Us };
}

async function latency(peer, tally, cli, log) {
  const { offered, offering } = await paced(peer, tally, cli, log);
  const completed = tally.count;
  const sorted = tally.latenciesUs.slice().sort((a, b) => a - b);
  return {
    scenario: "latency",
    seconds: cli.seconds,
    offered,
    completed,
    rate: cli.rate,
    achieved_rate: round3(offered / offering),
    latency_ms: percentiles(sorted),
  };
}

async function longHorizon(peer, tally, cli, log, meta) {
  const { offered, offering, t0Us } = await paced(peer, tally, cli, log);
  const completed = tally.count;
  const sorted = tally.latenciesUs.slice().sort((a, b) => a - b);
  const byWindow = windows(tally.startsUs, tally.latenciesUs, t0Us, cli.window);
  log(`${completed} of ${offered} ran; ${byWindow.length} windows of ${cli.window} s`);
  meta.knobs = { ...meta.knobs, window_s: cli.window };
  return {
    scenario: "long-horizon",
    rate: cli.rate,
    seconds: cli.seconds,
    work_ms: cli.workMs,
    offered,
    completed,
    achieved_rate: round3(offered / offering),
    latency_ms: percentiles(sorted),
    windows: byWindow,
  };
}

/** The rescue's victim: stores the jobs, starts workers whose handlers never
 * return, prints its line once they are all busy and waits to be killed. */
async function victim(peer, tally, cli, log, meta) {
  if (cli.events <= 0) throw new Error("--events must be positive");
  const t = performance.now();
  await store(peer, cli.events, "now");
  log(`${cli.events} runnable jobs stored in ${((performance.now() - t) / 1000).toFixed(1)} s`);
  await peer.start();
  const t0 = performance.now();
  let seen = 0;
  let since = performance.now();
  let running;
  for (;;) {
    if (tally.failure) throw tally.failure;
    const n = tally.count;
    if (n >= cli.events || (n > 0 && n === seen && performance.now() - since >= VICTIM_STEADY_MS)) {
      running = n;
      break;
    }
    if (n !== seen) {
      seen = n;
      since = performance.now();
    }
    if (performance.now() - t0 >= VICTIM_LIMIT_MS) throw new Error(`no job started in ${VICTIM_LIMIT_MS / 1000} s`);
    await sleep(20);
  }
  log(`${running} of ${cli.events} jobs held`);
  await hook(cli.hook, "victim-running");
  const line = {
    system: meta.system,
    version: meta.version,
    scenario: "rescue",
    role: "victim",
    running,
    events: cli.events,
    knobs: meta.knobs,
  };
  await new Promise((resolve) => process.stdout.write(JSON.stringify(line) + "\n", resolve));
  await Promise.race([sleep(VICTIM_LIMIT_MS), tally.failed]);
  throw new Error(`the victim was not killed within ${VICTIM_LIMIT_MS / 1000} s`);
}

/** The rescue's rescuer: runs workers on the victim's database until every
 * job has run once or `--timeout`; the workers are stopped after it. */
async function rescuer(peer, tally, cli, log) {
  await hook(cli.hook, "rescue-start");
  const t0 = performance.now();
  await peer.start();
  try {
    await tally.reached(cli.events, cli.timeout * 1000 - (performance.now() - t0), "rescue");
  } catch (e) {
    if (tally.failure) throw e;
  }
  const completed = Math.min(tally.count, cli.events);
  const timedOut = completed < cli.events;
  await hook(cli.hook, "rescue-end");
  log(`${completed} of ${cli.events} jobs ran (${tally.starts} runs)${timedOut ? ", timed out" : ""}`);
  const sinceKill = (us) => (us == null ? null : round3((us / 1000 - cli.killedAt) / 1000));
  return {
    scenario: "rescue",
    role: "rescuer",
    events: cli.events,
    completed,
    rescue_s: timedOut ? null : sinceKill(tally.lastNewUs),
    first_s: sinceKill(tally.firstUs),
    timed_out: timedOut,
    timeout_s: cli.timeout,
  };
}

async function idle(peer, tally, cli) {
  await peer.start();
  const idleFor = (ms) => Promise.race([sleep(ms), tally.failed]);
  await idleFor(IDLE_WARMUP_MS);
  await hook(cli.hook, "idle-start");
  await idleFor(cli.seconds * 1000);
  await hook(cli.hook, "idle-end");
  return { scenario: "idle", seconds: cli.seconds };
}

/** Parses the flags, runs the scenario, prints the result and exits: 0, or
 * 1 with the reason on stderr. */
export function runPeer({ system, version, knobs, install }) {
  const log = (msg) => console.error(`[${system}] ${msg}`);
  const fail = (e) => {
    console.error(`[${system}] error: ${e?.stack ?? e}`);
    process.exit(1);
  };
  process.on("unhandledRejection", fail);
  (async () => {
    const cli = parseCli();
    const mode =
      cli.scenario === "long-horizon" ? "work" : cli.scenario === "rescue" ? cli.role : "plain";
    const tally = new Tally(mode, cli.workMs);
    const peer = await install(cli.url, tally);
    const meta = { system, version, knobs };
    const scenario =
      cli.scenario === "rescue"
        ? { victim, rescuer }[cli.role]
        : { drain, latency, idle, "long-horizon": longHorizon }[cli.scenario];
    const result = await Promise.race([scenario(peer, tally, cli, log, meta), tally.failed]);
    await peer.stop();
    if (tally.failure) throw tally.failure;
    // Read after the stop, which flushes batched completions.
    if (cli.scenario === "drain" && peer.leftRunnable) {
      result.left_runnable = await peer.leftRunnable();
      if (result.left_runnable > 0)
        throw new Error(`the drain counted ${cli.events} runs, but the system says ${result.left_runnable} runnable jobs are left`);
    }
    await peer.close?.();
    const line = { system, version, ...result, knobs: meta.knobs };
    process.stdout.write(JSON.stringify(line) + "\n");
    process.exit(0);
  })().catch(fail);
}
