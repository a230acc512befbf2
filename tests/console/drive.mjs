// Drives quarry-console in Debian's Chromium, headless, with Playwright's own driver
// (playwright-core: no browser download; the system browser at /usr/bin/chromium).
//
//   node drive.mjs '<scenario JSON>'
//
// The scenario is {"base": "http://host:port", "shots": "<dir>", "steps": [...]}; each step
// visits a view the way an operator does and reports what the page shows. The results are
// printed as one JSON document on stdout; the Python test (tests/e2e/test_console_browser.py)
// holds every expectation.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

const EXECUTABLE = process.env.QUARRY_CHROMIUM || "/usr/bin/chromium";
const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync"];
const TIMEOUT_MS = Number(process.env.QUARRY_CONSOLE_STEP_TIMEOUT_MS || 60000);

const scenario = JSON.parse(process.argv[2]);

async function newBrowser() {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "quarry-console-profile-")); // a fresh --user-data-dir
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: EXECUTABLE, headless: true, args: [...ARGS, ...(scenario.chromiumArgs || [])], viewport: { width: 1400, height: 900 }, timezoneId: scenario.timezone || undefined,
  });
  context.setDefaultTimeout(TIMEOUT_MS);
  const errors = [];
  context.on("weberror", (e) => errors.push(String(e.error())));
  return { context, profile, errors };
}

async function ready(page) {
  await page.waitForSelector("body[data-state=ready]");
}

async function open(context, url) {
  const page = context.pages()[0] || (await context.newPage());
  await page.goto(url);
  await ready(page);
  return page;
}

// The page as an operator first sees it (the viewport; the whole page when it is short).
async function shot(page, name) {
  if (!scenario.shots) return;
  fs.mkdirSync(scenario.shots, { recursive: true });
  const height = await page.evaluate(() => document.documentElement.scrollHeight);
  await page.screenshot({ path: path.join(scenario.shots, `${name}.png`), fullPage: height <= 1800 });
}

async function rows(page, table) {
  return page.$$eval(`#${table} tbody tr.msg-row`, (trs) => trs.map((tr) => ({
    offsetMsgId: tr.dataset.offsetMsgId, uniqueKey: tr.dataset.uniqueKey, keys: tr.dataset.keys, tags: tr.dataset.tags, broker: tr.dataset.broker,
    queue: Number(tr.dataset.queue), queueOffset: Number(tr.dataset.queueOffset), storeMs: Number(tr.dataset.storeMs),
    time: tr.querySelector("td").textContent,
  })));
}

async function banners(page) {
  return page.$$eval("#banners .banner", (bs) => bs.map((b) => ({ kind: b.dataset.kind, text: b.textContent, brokers: b.dataset.brokers || "" })));
}

// --- steps ---------------------------------------------------------------------------------------

// Types into the search box (q, topic) and presses Search; reports the kind taken and the rows.
async function search(context, step) {
  const page = await open(context, `${scenario.base}/search`);
  await page.fill("#q", step.q);
  await page.fill("#search-topic", step.topic || "");
  await Promise.all([page.waitForURL((u) => u.searchParams.get("q") === step.q), page.click("#search-button")]);
  await ready(page);
  await page.waitForSelector("#search-kind, #error-banner");
  if (step.shot) await shot(page, step.shot);
  const kind = await page.$eval("#search-kind", (e) => e.dataset.kind).catch(() => "");
  return { url: page.url(), kind, rows: await rows(page, "search-table").catch(() => []), banners: await banners(page),
    zone: await page.textContent("#zone") };
}

// Browses a topic from a URL, follows "Next page" up to step.pages times; reports every page's
// rows, the URL of each page, and the histogram once its count is done.
async function browse(context, step) {
  const page = await open(context, `${scenario.base}${step.path}`);
  const pages = [];
  for (let i = 0; ; i++) {
    await page.waitForSelector("#browse-summary, #error-banner");
    pages.push({ url: page.url(), rows: await rows(page, "browse-table").catch(() => []), banners: await banners(page) });
    if (i === 0) {
      await page.waitForSelector("#histogram[data-done]");
      if (step.shot) await shot(page, step.shot);
    }
    const next = await page.$("#next-page");
    if (!next || pages.length >= (step.pages || 1)) break;
    await Promise.all([page.waitForURL((u) => u.searchParams.get("page") === String(i + 2)), next.click()]);
    await ready(page);
  }
  const first = pages[0].url;
  await page.goto(first);
  await ready(page);
  await page.waitForSelector("#histogram[data-done]");
  const histogram = await page.$eval("#histogram", (svg) => ({
    done: svg.dataset.done, total: Number(svg.dataset.total),
    bars: [...svg.querySelectorAll("rect.bar")].map((r) => ({ count: Number(r.dataset.count), from: Number(r.dataset.from), to: Number(r.dataset.to) })),
  }));
  histogram.status = await page.textContent("#histogram-status");
  let zoom = null;
  if (step.zoom) { // drag across the middle half of the chart: the window becomes what was dragged over
    const box = await page.locator("#histogram").boundingBox();
    const y = box.y + box.height / 2;
    await page.mouse.move(box.x + box.width * 0.25, y);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * 0.5, y, { steps: 5 });
    await page.mouse.move(box.x + box.width * 0.75, y, { steps: 5 });
    await Promise.all([page.waitForURL((u) => u.href !== first), page.mouse.up()]);
    await ready(page);
    await page.waitForSelector("#histogram[data-done]");
    zoom = { url: page.url(), rows: await rows(page, "browse-table"), total: Number(await page.$eval("#histogram", (s) => s.dataset.total)) };
  }
  return { pages, histogram, zoom };
}

// Opens a URL as pasted into a fresh browser (new profile): what the view shows.
async function paste(step) {
  const b = await newBrowser();
  try {
    const page = await open(b.context, step.url);
    await page.waitForSelector("#browse-summary, #search-kind, #fields, #error-banner");
    if (step.path === "browse") await page.waitForSelector("#histogram[data-done]");
    return { url: page.url(), rows: await rows(page, step.table).catch(() => []), banners: await banners(page), errors: b.errors };
  } finally {
    await b.context.close();
    fs.rmSync(b.profile, { recursive: true, force: true });
  }
}

// A message page: fields, properties, where it is stored, the consume status, the body views.
async function message(context, step) {
  const page = await open(context, `${scenario.base}${step.path}`);
  await page.waitForSelector("#fields, #error-banner");
  await page.waitForSelector("#track-table, #track-none, #track-error");
  const fields = await page.$$eval("#fields tr", (trs) => Object.fromEntries(trs.map((tr) => [tr.dataset.field, tr.querySelector("td").textContent])));
  const properties = await page.$$eval("#properties tbody tr", (trs) => Object.fromEntries(trs.map((tr) => [tr.dataset.name, tr.querySelectorAll("td")[1].textContent])));
  const track = await page.$$eval("#track-table tbody tr", (trs) => trs.map((tr) => ({ group: tr.dataset.group, state: tr.dataset.state })));
  const body = {};
  for (const mode of ["text", "json", "hex"]) {
    await page.click(`#body-tabs button[data-mode=${mode}]`);
    body[mode] = await page.textContent("#body");
  }
  await page.click("#body-tabs button[data-mode=json]");
  if (step.shot) await shot(page, step.shot);
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("#download")]);
  const downloaded = fs.readFileSync(await download.path()).toString("base64");
  return { url: page.url(), fields, properties, track, body, downloaded, stored: await page.textContent("#stored") };
}

async function view(context, step) {
  const page = await open(context, `${scenario.base}${step.path}`);
  await page.waitForSelector(step.wait);
  if (step.shot) await shot(page, step.shot);
  return { url: page.url(), banners: await banners(page), rows: step.table ? await rows(page, step.table) : [] };
}

// Logs in on /login (step.next: the view to land on); reports where it landed, the banners,
// the header's account and the console's cookie as the browser keeps it.
async function login(context, step) {
  const page = await open(context, `${scenario.base}/login${step.next ? "?next=" + encodeURIComponent(step.next) : ""}`);
  await page.fill("#access-key", step.accessKey);
  await page.fill("#secret-key", step.secretKey);
  await page.click("#login-button");
  await page.waitForSelector(step.fails ? "#error-banner" : "#account-key");
  await ready(page);
  if (step.wait) await page.waitForSelector(step.wait);
  if (step.shot) await shot(page, step.shot);
  const cookies = (await context.cookies()).map((c) => ({ name: c.name, httpOnly: c.httpOnly, sameSite: c.sameSite, secure: c.secure, value: c.value }));
  return { url: page.url(), banners: await banners(page), account: await page.textContent("#account"), cookies,
    rows: step.table ? await rows(page, step.table) : [], scriptCookie: await page.evaluate(() => document.cookie) };
}

// Times a view from navigation to its first row (step.selector), step.repeat times, each a fresh
// load in the same running browser (bench/console.py); reports each time in milliseconds.
async function firstRow(context, step) {
  const page = context.pages()[0] || (await context.newPage());
  const ms = [];
  for (let i = 0; i < (step.repeat || 1); i++) {
    await page.goto("about:blank");
    const t0 = performance.now();
    await page.goto(`${scenario.base}${step.path}`, { waitUntil: "commit" });
    await page.waitForSelector(step.selector);
    ms.push(performance.now() - t0);
  }
  return { times: ms, rows: await page.$$eval(step.selector, (r) => r.length) };
}

async function logout(context, step) {
  const page = context.pages()[0];
  await Promise.all([page.waitForURL((u) => u.pathname === "/login"), page.click("#logout")]);
  await page.waitForSelector("#login-link");
  return { url: page.url(), account: await page.textContent("#account"), cookies: (await context.cookies()).map((c) => c.name) };
}

// A %DLQ% topic's page: every message selected, the resend planned (the confirmation shown),
// confirmed; reports the rows, the plan, and each resend's new ids.
async function dlq(context, step) {
  const page = await open(context, `${scenario.base}${step.path}`);
  await page.waitForSelector("#browse-summary");
  const listed = await rows(page, "browse-table");
  await page.check("#dlq-select-all");
  await page.click("#resend-button");
  await page.waitForSelector("#resend-confirm");
  const plan = await page.$$eval("#resend-plan tbody tr", (trs) => trs.map((tr) => ({ offsetMsgId: tr.dataset.offsetMsgId, toTopic: tr.dataset.toTopic, refused: tr.dataset.refused })));
  const resentBeforeConfirm = await page.$$eval("#resend-results tbody tr", (trs) => trs.length);
  if (step.shot) await shot(page, `${step.shot}-confirm`);
  await page.click("#resend-confirm-button");
  await page.waitForSelector("#resend-done");
  if (step.shot) await shot(page, step.shot);
  const done = await page.$eval("#resend-done", (d) => ({ resent: d.dataset.resent, refused: d.dataset.refused }));
  const results = await page.$$eval("#resend-results tbody tr", (trs) => trs.map((tr) => ({ offsetMsgId: tr.dataset.offsetMsgId, newMsgId: tr.dataset.newMsgId,
    newOffsetMsgId: tr.dataset.newOffsetMsgId, toTopic: tr.dataset.toTopic })));
  return { url: page.url(), rows: listed, plan, resentBeforeConfirm, done, results, banners: await banners(page) };
}

// The cluster page once every broker's status is in: stores, groups with lag, dead letters, queues.
async function cluster(context, step) {
  const page = await open(context, `${scenario.base}/cluster`);
  await page.waitForSelector("#cluster-status[data-done], #status-error");
  if (step.shot) await shot(page, step.shot);
  const data = (sel, keys) => page.$$eval(sel, (trs, ks) => trs.map((tr) => Object.fromEntries(ks.map((k) => [k, tr.dataset[k] ?? ""]))), keys);
  return { url: page.url(), banners: await banners(page),
    stores: await data("#store-status tbody tr", ["broker", "damaged", "indexLagBytes", "writtenBytes", "expiredTo"]),
    groups: await data("#consumer-groups tbody tr", ["group", "topic", "source", "lag"]),
    deadLetters: await data("#dead-letters tbody tr", ["group", "topic", "messages"]),
    queues: await data("#queue-offsets tbody tr", ["topic", "broker", "queue", "min", "max"]) };
}

// A message page's trace timeline and copies, once both are in.
async function history(context, step) {
  const page = await open(context, `${scenario.base}${step.path}`);
  await page.waitForSelector("#fields, #error-banner");
  await page.waitForSelector("#trace[data-done]");
  await page.waitForSelector("#copies[data-done]");
  if (step.shot) { await page.locator("#trace").scrollIntoViewIfNeeded(); await shot(page, step.shot); }
  const timeline = await page.$$eval("#trace-timeline li", (lis) => lis.map((li) => ({ type: li.dataset.type, group: li.dataset.group, success: li.dataset.success, ms: Number(li.dataset.ms) })));
  const copies = await page.$$eval("#copies-table tbody tr.msg-row", (trs) => trs.map((tr) => ({ offsetMsgId: tr.dataset.offsetMsgId, uniqueKey: tr.dataset.uniqueKey,
    topic: tr.querySelectorAll("td")[1].textContent, this: tr.dataset.this || "", href: tr.querySelector("a.msg-link").getAttribute("href") })));
  // what the copies section holds, in order: elements by id (or tag), any bare text as such
  const copiesParts = await page.$eval("#copies", (box) => [...box.childNodes].map((n) => (n.nodeType === 1 ? n.id || n.tagName : `text:${n.textContent}`)));
  return { url: page.url(), timeline, copies, copiesParts, traceText: await page.textContent("#trace"), stored: await page.textContent("#stored") };
}

const b = await newBrowser();
const results = [];
try {
  for (const step of scenario.steps) {
    const run = { search, browse, message, view, login, logout, dlq, cluster, history, firstRow }[step.do];
    const started = Date.now();
    const result = step.do === "paste" ? await paste(step) : await run(b.context, step);
    result.ms = Date.now() - started;
    results.push(result);
  }
} finally {
  await b.context.close();
  fs.rmSync(b.profile, { recursive: true, force: true });
}
process.stdout.write(JSON.stringify({ results, errors: b.errors }) + "\n");
