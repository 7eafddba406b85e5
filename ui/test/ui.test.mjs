// The web UI in a real browser (Debian's headless chromium driven by playwright-core) against
// the warren binary: log in, declare a queue, publish from the UI, see the queue's rate chart
// move, get the message back, apply a policy and see it take effect; every page is visited and,
// with SCREENSHOT_DIR set, photographed for docs/ui.md.
//
//   WARREN_BIN=target/release/warren node ui/test/ui.test.mjs
//
// A `warren perf` producer and consumer run beside it so that the connection, channel and
// overview pages have something to show. Every wait is a deadline on a condition, never a
// fixed sleep, so a slow machine makes it slower, not red.

import { chromium } from "playwright-core";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, mkdirSync } from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import assert from "node:assert/strict";

const BIN = resolve(process.env.WARREN_BIN || "target/release/warren");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const SHOTS = process.env.SCREENSHOT_DIR ? resolve(process.env.SCREENSHOT_DIR) : null;
// Deadlines, not delays: rates are sampled every 5 s, so the longest wait spans a few samples.
const STEP_MS = 30_000;

function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

async function waitPort(port, ms) {
  const deadline = Date.now() + ms;
  for (;;) {
    const up = await new Promise((ok) => {
      const c = connect(port, "127.0.0.1", () => { c.end(); ok(true); });
      c.on("error", () => ok(false));
    });
    if (up) return;
    if (Date.now() > deadline) throw new Error(`nothing listens on ${port} after ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

function log(...a) {
  console.log("[ui-test]", ...a);
}

const children = [];
const dirs = [];
let browser = null;

function start(cmd, args, name) {
  const p = spawn(cmd, args, { stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  p.stderr.on("data", (d) => { err = (err + d).slice(-4000); });
  p.on("exit", (code, sig) => { if (code && !p.killed) log(`${name} exited ${code ?? sig}: ${err}`); });
  children.push(p);
  return p;
}

async function cleanup() {
  if (browser) await browser.close().catch(() => {});
  for (const p of children) if (p.exitCode === null) p.kill("SIGTERM");
  await Promise.all(children.map((p) => (p.exitCode === null ? new Promise((r) => p.once("exit", r)) : null)));
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
}

async function shot(page, name) {
  if (!SHOTS) return;
  mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: join(SHOTS, `ui-${name}.png`), fullPage: true });
}

/** The text of the figure `key` on a page of `.total` tiles. */
async function figure(page, key) {
  return (await page.locator(`.total[data-key="${key}"] .v`).textContent()).trim();
}

async function main() {
  const [amqp, http] = [await freePort(), await freePort()];
  const data = mkdtempSync(join(tmpdir(), "warren-ui-test-"));
  dirs.push(data);
  start(BIN, ["server", "--listen", `127.0.0.1:${amqp}`, "--management-listen", `127.0.0.1:${http}`, "--data-dir", data], "warren");
  await waitPort(http, 30_000);
  await waitPort(amqp, 30_000);
  start(BIN, ["perf", "--uri", `amqp://guest:guest@127.0.0.1:${amqp}`, "-x", "1", "-y", "1", "-u", "perf-load", "-r", "20", "-z", "600"], "warren perf");

  const profile = mkdtempSync(join(tmpdir(), "warren-ui-chromium-"));
  dirs.push(profile);
  // A fresh profile each run (playwright passes it as --user-data-dir).
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1280, height: 900 },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = browser.pages()[0] || (await browser.newPage());
  page.setDefaultTimeout(STEP_MS);
  page.on("dialog", (d) => d.accept());
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  const base = `http://127.0.0.1:${http}/?refresh=1000`;

  log("a wrong password is refused");
  await page.goto(base);
  await page.fill("#login [name=username]", "guest");
  await page.fill("#login [name=password]", "wrong");
  await page.click("#login button[type=submit]");
  await page.locator("#login p.error", { hasText: "Login failed" }).waitFor();
  await shot(page, "login");

  log("log in");
  await page.fill("#login [name=password]", "guest");
  await page.click("#login button[type=submit]");
  await page.locator("nav .who", { hasText: "guest" }).waitFor();

  log("overview: the perf client's traffic moves the rate chart");
  // For the screenshot, a chart with some history (a dozen refreshes) rather than two points.
  const points = SHOTS ? 12 : 2;
  await page.waitForFunction((n) => {
    const last = JSON.parse(document.querySelector("#rates-chart")?.dataset.last || "{}");
    return last.publish > 0 && Number(document.querySelector("#queued-chart")?.dataset.points) >= n;
  }, points);
  await shot(page, "overview");

  for (const [name, id] of [["connections", "#connections"], ["channels", "#channels"], ["exchanges", "#exchanges"]]) {
    await page.click(`nav a[href="#/${name}"]`);
    await page.locator(`${id} tbody tr`).first().waitFor();
    if (name !== "exchanges") await page.locator(`${id} tbody td`, { hasText: "guest" }).first().waitFor();
    await shot(page, name);
  }
  log("connections are paged and filtered on the server, each with its node");
  await page.click('nav a[href="#/connections"]');
  await page.locator("#connection-pager", { hasText: "Page 1 of 1" }).waitFor();
  assert.ok((await page.locator("#connections tbody td").allTextContents()).some((t) => t.startsWith("warren@")));
  await page.fill("#connection-filter", "no-such-connection");
  await page.locator("#connection-pager", { hasText: "— 0 of" }).waitFor();
  await page.locator("#connections td.empty").waitFor();
  await page.click('nav a[href="#/exchanges"]');
  log("exchanges are filtered on the server too");
  await page.fill("#exchange-filter", "amq.topic");
  await page.locator("#exchange-pager", { hasText: "— 1 of" }).waitFor();
  assert.equal(await page.locator("#exchanges tbody tr").count(), 1);

  log("declare a queue from the UI");
  await page.click('nav a[href="#/queues"]');
  await page.fill("#declare-queue [name=name]", "ui-orders");
  await page.click("#declare-queue button[type=submit]");
  await page.locator("#declare-queue .status.ok").waitFor();
  await page.locator("#queues a", { hasText: "ui-orders" }).waitFor();

  log("the listing is filtered on the server");
  await page.fill("#queue-filter", "ui-ord");
  await page.locator("#queue-pager", { hasText: "1 of 2 queues" }).waitFor();
  assert.equal(await page.locator("#queues tbody tr").count(), 1);
  await page.fill("#queue-filter", "");
  await page.locator("#queue-pager", { hasText: "2 of 2 queues" }).waitFor();
  await shot(page, "queues");

  log("publish from the queue's page; its rate chart moves");
  await page.click("#queues a:text-is('ui-orders')");
  await page.locator("#queue-info").waitFor();
  for (let i = 1; i <= 3; i++) {
    await page.fill("#publish-message [name=payload]", `hello from the UI ${i}`);
    await page.click("#publish-message button[type=submit]");
    await page.locator("#publish-message .status.ok", { hasText: "Message published." }).waitFor();
    await page.evaluate(() => { document.querySelector("#publish-message .status").textContent = ""; });
  }
  await page.waitForFunction(() => document.querySelector('.total[data-key="Total"] .v')?.textContent === "3");
  await page.waitForFunction(() => JSON.parse(document.querySelector("#queue-rates-chart")?.dataset.last || "{}").publish > 0);

  log("get the first message back (requeued)");
  await page.click("#get-messages button[type=submit]");
  await page.locator("#got-messages pre.payload", { hasText: "hello from the UI 1" }).waitFor();
  await shot(page, "queue");

  log("apply a policy in admin; the queue shows it and is cut to its max-length");
  await page.click('nav a[href="#/admin"]');
  await page.fill("#add-policy [name=name]", "ui-limit");
  await page.fill("#add-policy [name=pattern]", "^ui-");
  await page.fill("#add-policy [name=definition]", '{"max-length": 1}');
  await page.click("#add-policy button[type=submit]");
  await page.locator("#add-policy .status.ok").waitFor();
  await page.locator("#policies-table td", { hasText: "ui-limit" }).waitFor();
  await page.locator("#users-table td", { hasText: "guest" }).first().waitFor();
  await shot(page, "admin");
  await page.goto(`http://127.0.0.1:${http}/?refresh=1000#/queue/%2F/ui-orders`);
  await page.waitForFunction(() => document.querySelector('.total[data-key="Policy"] .v')?.textContent === "ui-limit");
  await page.waitForFunction(() => document.querySelector('.total[data-key="Total"] .v')?.textContent === "1");
  assert.match(await figure(page, "Effective policy"), /"max-length":1/);
  // max-length drops from the head: the newest message is the one left.
  await page.click("#get-messages button[type=submit]");
  await page.locator("#got-messages pre.payload", { hasText: "hello from the UI 3" }).waitFor();

  log("purge and delete from the UI");
  await page.click("#purge");
  await page.waitForFunction(() => document.querySelector('.total[data-key="Total"] .v')?.textContent === "0");
  await page.click("#delete-queue");
  await page.waitForURL(/#\/queues$/);
  await page.locator("#queue-pager", { hasText: "1 of 1 queues" }).waitFor();

  await clusterPages(page);

  assert.deepEqual(errors, [], "the pages threw");
  log("passed");
}

/** A 3-node cluster seen from one node's UI: a quorum queue's page names its leader, its
 *  members and which are online, and the admin page's node table has every node's figures. */
async function clusterPages(page) {
  log("a 3-node cluster: a quorum queue's page and the node table, from another node");
  const ports = [];
  for (let i = 0; i < 9; i++) ports.push(await freePort());
  const cluster = (i) => `127.0.0.1:${ports[6 + i]}`;
  const seeds = [0, 1, 2].map(cluster).join(",");
  const http = (i) => ports[3 + i];
  for (const i of [0, 1, 2]) {
    const data = mkdtempSync(join(tmpdir(), `warren-ui-cluster-${i}-`));
    dirs.push(data);
    start(BIN, ["server", "--node-name", `ui${i + 1}`, "--listen", `127.0.0.1:${ports[i]}`,
      "--management-listen", `127.0.0.1:${http(i)}`, "--cluster-listen", cluster(i),
      "--cluster-seeds", seeds, "--data-dir", data], `cluster node ${i + 1}`);
  }
  for (const i of [0, 1, 2]) await waitPort(http(i), 30_000);
  const auth = { Authorization: "Basic " + Buffer.from("guest:guest").toString("base64") };
  // Declared on node 1 once the cluster formed (a declare before it is refused: retried).
  const deadline = Date.now() + STEP_MS;
  for (;;) {
    const r = await fetch(`http://127.0.0.1:${http(0)}/api/queues/%2F/ui-quorum`, {
      method: "PUT",
      headers: { ...auth, "content-type": "application/json" },
      body: JSON.stringify({ durable: true, arguments: { "x-queue-type": "quorum" } }),
    });
    if (r.ok) break;
    if (Date.now() > deadline) throw new Error(`declaring the quorum queue: ${r.status} ${await r.text()}`);
    await new Promise((ok) => setTimeout(ok, 200));
  }
  const base = `http://127.0.0.1:${http(1)}/?refresh=1000`;
  await page.goto(base);
  await page.fill("#login [name=username]", "guest");
  await page.fill("#login [name=password]", "guest");
  await page.click("#login button[type=submit]");
  await page.locator("nav .who", { hasText: "guest" }).waitFor();
  await page.goto(`${base}#/queue/%2F/ui-quorum`);
  await page.waitForFunction(() => {
    const v = (k) => document.querySelector(`.total[data-key="${k}"] .v`)?.textContent || "";
    const all = (t) => ["ui1", "ui2", "ui3"].every((n) => t.includes(n));
    return /^ui[123]$/.test(v("Leader").trim()) && all(v("Members")) && all(v("Online"));
  });
  await shot(page, "quorum-queue");
  await page.click('nav a[href="#/admin"]');
  await page.locator("#nodes-table tbody tr").nth(2).waitFor();
  const rows = await page.locator("#nodes-table tbody tr").allTextContents();
  assert.equal(rows.length, 3, rows.join(" | "));
  for (const [i, row] of rows.entries()) {
    assert.ok(row.includes(`ui${i + 1}`), row);
    assert.ok(!row.includes("undefined") && !row.includes("NaN"), row);
    // Every node's own figures, asked of it over the cluster links.
    assert.match(row, / of /, row);
  }
}

const timer = setTimeout(() => {
  log("timed out after 240 s");
  cleanup().finally(() => process.exit(1));
}, 240_000);
main()
  .then(() => cleanup())
  .then(() => {
    clearTimeout(timer);
    process.exit(0);
  })
  .catch(async (e) => {
    console.error("[ui-test] FAILED:", e.message);
    await cleanup();
    clearTimeout(timer);
    process.exit(1);
  });
