// Drives herald's dashboard in headless Chromium.
//
//   node dashboard.mjs <base url> <operator token> <screenshot path>
//
// Expects a server with tenant "acme", a handler "flaky" whose events are
// dead, and a working handler "work" (see ../dashboard.rs). Exits non-zero,
// saying which step failed, on the first thing that is wrong.

import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { chromium } from "playwright-core";

const [base, token, shot] = process.argv.slice(2);
if (!base || !token || !shot) {
  console.error("usage: node dashboard.mjs <base url> <operator token> <screenshot path>");
  process.exit(2);
}

const TENANT = "acme";
const FLAKY = "flaky";

let step = "start";
function log(msg) {
  console.log(`[dashboard.mjs] ${msg}`);
}
function begin(name) {
  step = name;
  log(`step: ${name}`);
}
function check(ok, msg) {
  if (!ok) throw new Error(msg);
}

async function api(method, path) {
  const r = await fetch(base + path, { method, headers: { Authorization: `Bearer ${token}` } });
  const text = await r.text();
  if (!r.ok) throw new Error(`${method} ${path}: HTTP ${r.status}: ${text}`);
  return JSON.parse(text);
}

async function rulesFor(tenant, handler) {
  const { rules } = await api("GET", "/v1/rules");
  return rules.filter((r) => r.tenant === tenant && r.handler === handler).map((r) => r.kind);
}

// A fresh profile (--user-data-dir) for every run: playwright takes it as
// the persistent context's directory.
const profile = mkdtempSync(join(tmpdir(), "herald-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1400, height: 1000 },
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});

const pageErrors = [];
let page;
try {
  page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(15000);
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  page.on("console", (m) => {
    if (m.type() === "error") log(`browser console: ${m.text()}`);
  });

  begin("open the page without a token: the 401 is shown, not hidden");
  const response = await page.goto(base + "/");
  check(response.ok(), `GET / answered ${response.status()}`);
  await page.getByTestId("status").filter({ hasText: "needs a token" }).waitFor();
  const first = await page.getByTestId("errors").textContent();
  check(first.includes("missing_token"), `the error banner does not show the API's error verbatim: ${first}`);

  begin("enter the token");
  await page.fill("#token", token);
  await page.click("#token-save");
  await page.getByTestId("status").filter({ hasText: "live" }).waitFor();
  check((await page.getByTestId("errors").textContent()).trim() === "", "errors are still shown after entering the token");
  check(await page.evaluate(() => localStorage.getItem("herald.token")) === token, "the token is not kept in localStorage");
  const tokenState = await page.getByTestId("token-state").textContent();
  check(tokenState.includes("saved"), `token state says ${tokenState}`);

  const row = page.locator(`tr[data-testid="handler-row"][data-tenant="${TENANT}"][data-handler="${FLAKY}"]`);
  const workRow = page.locator(`tr[data-testid="handler-row"][data-tenant="${TENANT}"][data-handler="work"]`);
  begin("the handlers table lists acme/flaky with its dead events and acme/work");
  await row.waitFor();
  await workRow.waitFor();
  const col = (name) => row.locator(`td[data-col="${name}"]`).textContent();
  const cells = JSON.stringify(await row.locator("td").allTextContents());
  check(Number(await col("dead")) > 0, `acme/flaky shows no dead events: ${cells}`);
  const state = await col("state");
  check(state.includes("not held"), `acme/flaky is not shown as not held: ${cells}`);
  check(!state.includes("running"), `acme/flaky still has a "running" badge: ${cells}`);
  check(!state.includes("not run by this server"), `acme/flaky is run by this server: ${cells}`);

  begin("the topics section lists the subscription from herald.toml");
  const sub = page.locator(`tr[data-testid="subscription-row"]`).filter({ hasText: "user.signup" });
  await sub.waitFor();
  const subCells = await sub.locator("td").allTextContents();
  check(subCells[2] === FLAKY && subCells[1].includes("every tenant"), `the topics row shows ${JSON.stringify(subCells)}`);

  begin("emit to a topic without subscribers through the page: the API's 422 is shown");
  await page.fill("#topic-emit-tenant", TENANT);
  await page.fill("#topic-emit-topic", "nobody.listens");
  await page.click("#topic-emit-send");
  const refused = page.locator('[data-testid="error"][data-kind="action"]').filter({ hasText: "no_subscribers" });
  await refused.waitFor();
  await refused.locator("button").click();
  await refused.waitFor({ state: "detached" });

  begin("emit to user.signup through the page: one event for its subscriber, with the topic");
  await page.fill("#topic-emit-topic", "user.signup");
  await page.fill("#topic-emit-payload", '{"user": 42}');
  await page.click("#topic-emit-send");
  const result = page.getByTestId("topic-emit-result");
  await result.filter({ hasText: "1 event" }).waitFor();
  const emittedId = await result.getAttribute("data-ids");
  const emitted = await api("GET", `/v1/events/${emittedId}`);
  check(emitted.topic === "user.signup" && emitted.handler === FLAKY && emitted.payload.user === 42,
    `the page's topic emit stored ${JSON.stringify(emitted)}`);

  begin("pause acme/flaky through the page");
  await row.locator('button[data-action="pause"]').click();
  await row.getByTestId("badge-paused").waitFor();
  await row.locator('button[data-action="unpause"]').waitFor();
  check((await rulesFor(TENANT, FLAKY)).includes("pause"), "the page shows PAUSED but GET /v1/rules has no pause rule");

  begin("retry a dead event through its button (acme/flaky is paused: it stays pending)");
  const deadRow = page.locator(`tr[data-testid="dead-row"]`).first();
  await deadRow.waitFor();
  const id = await deadRow.getAttribute("data-id");
  const before = await api("GET", `/v1/events/${id}`);
  check(before.state === "dead", `event ${id} is ${before.state} before the retry`);
  const lastError = await deadRow.locator("td.err").textContent();
  check(lastError === before.last_error, `the page shows last error ${JSON.stringify(lastError)}, the API ${JSON.stringify(before.last_error)}`);
  await deadRow.locator('button[data-action="retry"]').click();
  await page.locator(`tr[data-testid="dead-row"][data-id="${id}"]`).waitFor({ state: "detached" });
  const after = await api("GET", `/v1/events/${id}`);
  check(after.state === "pending", `event ${id} is ${after.state} after the retry, not pending`);
  check(after.attempt === 0, `event ${id} has attempt ${after.attempt} after the retry, not 0`);

  begin("unpause acme/flaky through the page");
  await row.locator('button[data-action="unpause"]').click();
  await row.getByTestId("badge-paused").waitFor({ state: "detached" });
  await row.locator('button[data-action="pause"]').waitFor();
  check(!(await rulesFor(TENANT, FLAKY)).includes("pause"), "the page shows no PAUSED badge but GET /v1/rules still has the pause rule");

  begin("the retried event runs again (and fails for good again)");
  const deadline = Date.now() + 15000;
  for (;;) {
    const e = await api("GET", `/v1/events/${id}`);
    if (e.state === "dead" && e.attempt >= 1) break;
    check(Date.now() < deadline, `event ${id} did not run after the unpause: ${JSON.stringify(e)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  await page.locator(`tr[data-testid="dead-row"][data-id="${id}"]`).waitFor();

  begin("an action's error is shown verbatim");
  // The page keeps showing the event as dead (its list is frozen), while
  // the event is retried behind its back (acme/flaky paused: it stays
  // pending). The stale Retry button then gets the API's 409 not_dead,
  // which the page must show as the API wrote it.
  await api("PUT", `/v1/tenants/${TENANT}/handlers/${FLAKY}/pause`);
  const frozen = await api("GET", "/v1/events?state=dead&limit=200");
  await page.route("**/v1/events?state=dead*", (route) => route.fulfill({ json: frozen }));
  await api("POST", `/v1/events/${id}/retry`);
  await page.locator(`tr[data-testid="dead-row"][data-id="${id}"] button[data-action="retry"]`).click();
  const banner = page.locator('[data-testid="error"][data-kind="action"]').filter({ hasText: "not_dead" });
  await banner.waitFor();
  const shown = await banner.textContent();
  const expected = `HTTP 409 not_dead: event ${id} is pending, not dead: only dead events can be retried`;
  check(shown.includes(expected), `the banner says ${JSON.stringify(shown)}, not ${JSON.stringify(expected)}`);
  log(`shown: ${shown}`);
  await banner.locator("button").click();
  await banner.waitFor({ state: "detached" });
  await page.unroute("**/v1/events?state=dead*");
  await api("DELETE", `/v1/tenants/${TENANT}/handlers/${FLAKY}/pause`);
  await row.getByTestId("badge-paused").waitFor({ state: "detached" });

  begin("the charts have data");
  await page.waitForFunction(() => document.querySelectorAll("#chart-throughput polyline").length > 0);
  await page.waitForTimeout(4500); // a few more points on the chart

  check(pageErrors.length === 0, `the page threw: ${pageErrors.join("\n")}`);

  begin(`screenshot to ${shot}`);
  mkdirSync(dirname(shot), { recursive: true });
  await page.screenshot({ path: shot, fullPage: true });
  log("all steps passed");
} catch (e) {
  console.error(`[dashboard.mjs] FAILED at step "${step}": ${e && e.stack ? e.stack : e}`);
  if (page) {
    const failShot = shot.replace(/\.png$/, "") + "-failure.png";
    try {
      mkdirSync(dirname(failShot), { recursive: true });
      await page.screenshot({ path: failShot, fullPage: true });
      console.error(`[dashboard.mjs] the page at the failure: ${failShot}`);
    } catch (_) {}
  }
  process.exitCode = 1;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
