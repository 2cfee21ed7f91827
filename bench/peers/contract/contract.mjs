// The Node.js peers' side of the contract in ../README.md (the Rust peers'
// is src/, the peer-contract crate): the flags, the three scenarios, the
// hooks, the paced producer, the percentiles and the result line, once, so
// each peer only says how its system installs, stores, starts, inserts and
// stops.
//
//   import { runPeer } from "../contract/contract.mjs";
//   runPeer({ system, version, knobs, install });
//
// `install(url, tally)` runs the system's migrations and returns
//   { store(from, to, due), start(), insert(job), stop(), leftRunnable?(), close?() }
// where `due` is "now" or "in-a-day", `job` is { seq, t_us }, and the
// system's handler calls `tally.ran(job.t_us)` first thing for each job.
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
    },
    strict: true,
  });
  if (!values.url) throw new Error("--url is required");
  if (!["drain", "latency", "idle"].includes(values.scenario))
    throw new Error("--scenario must be drain, latency or idle");
  const count = (name) => {
    const n = Number(values[name]);
    if (!Number.isInteger(n) || n < 0) throw new Error(`--${name} must be a non-negative integer`);
    return n;
  };
  const seconds = Number(values.seconds ?? (values.scenario === "idle" ? 60 : 20));
  if (!Number.isFinite(seconds) || seconds < 0) throw new Error("--seconds must be a number >= 0");
  return {
    url: values.url,
    scenario: values.scenario,
    events: count("events"),
    backlog: count("backlog"),
    rate: count("rate"),
    seconds,
    hook: values.hook,
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

/** Runs counted by the handlers, watched by the scenario. */
class Tally {
  constructor() {
    this.count = 0;
    this.latenciesUs = [];
    this.waiters = []; // { n, resolve }
    this.failure = null;
    this.onFailure = null;
    this.failed = new Promise((_, reject) => (this.onFailure = reject));
    this.failed.catch(() => {});
  }
  /** Called by the handler first thing, with the job's `t_us`. */
  ran(tUs) {
    if (tUs > 0) this.latenciesUs.push(epochMicros() - tUs);
    this.add(1, null);
  }
  /** `n` runs reported at once (by a worker thread), with their samples. */
  add(n, latenciesUs) {
    if (latenciesUs) for (const l of latenciesUs) this.latenciesUs.push(l);
    this.count += n;
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
  await hook(cli.hook, "drain-end");
  await mid;
  return {
    scenario: "drain",
    events: cli.events,
    backlog: cli.backlog,
    seconds: round3(seconds),
    events_per_s: seconds > 0 ? Math.round(cli.events / seconds) : 0,
  };
}

async function latency(peer, tally, cli, log) {
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
  const completed = tally.count;
  const sorted = tally.latenciesUs.slice().sort((a, b) => a - b);
  return {
    scenario: "latency",
    seconds: cli.seconds,
    offered,
    completed,
    rate: cli.rate,
    achieved_rate: round3(offered / offering),
    latency_ms: {
      p50: percentileMs(sorted, 0.5),
      p99: percentileMs(sorted, 0.99),
      max: percentileMs(sorted, 1),
    },
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
    const tally = new Tally();
    const peer = await install(cli.url, tally);
    const scenario = { drain, latency, idle }[cli.scenario];
    const result = await Promise.race([scenario(peer, tally, cli, log), tally.failed]);
    await peer.stop();
    if (tally.failure) throw tally.failure;
    // Read after the stop, which flushes batched completions.
    if (cli.scenario === "drain" && peer.leftRunnable) {
      result.left_runnable = await peer.leftRunnable();
      if (result.left_runnable > 0)
        throw new Error(`the drain counted ${cli.events} runs, but the system says ${result.left_runnable} runnable jobs are left`);
    }
    await peer.close?.();
    const line = { system, version, ...result, knobs };
    process.stdout.write(JSON.stringify(line) + "\n");
    process.exit(0);
  })().catch(fail);
}
