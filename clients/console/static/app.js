// Quarry Console: plain JavaScript, no build step. Each view reads its query from the URL
// (location.pathname + search) and asks the console's JSON API (/api/...), which asks the
// routers. Times are shown to the millisecond in the browser's zone, named in the header.
"use strict";

// ---- small helpers ------------------------------------------------------------------------
const $ = (sel, root = document) => root.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k.startsWith("data-")) e.setAttribute(k, String(v));
    else if (k in e && typeof v !== "string") e[k] = v;
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const pad = (n, w = 2) => String(n).padStart(w, "0");

function zoneName() {
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
  const off = -new Date().getTimezoneOffset();
  const sign = off >= 0 ? "+" : "-";
  return `${zone} (UTC${sign}${pad(Math.floor(Math.abs(off) / 60))}:${pad(Math.abs(off) % 60)})`;
}

// yyyy-MM-dd HH:mm:ss.SSS in the browser's zone
function fmtTime(ms) {
  if (!ms) return "";
  const d = new Date(Number(ms));
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

// <input type=datetime-local step=0.001> value (local time) <-> epoch ms
function toLocalInput(ms) {
  if (!ms) return "";
  return fmtTime(ms).replace(" ", "T");
}
function fromLocalInput(value) {
  if (!value) return "";
  const d = new Date(value); // a date-time without an offset is local time
  return isNaN(d.getTime()) ? "" : String(d.getTime());
}

function params() { return new URLSearchParams(location.search); }

function viewUrl(path, query) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== "" && v !== undefined && v !== null) q.set(k, v);
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

function go(url, replace = false) {
  if (replace) history.replaceState(null, "", url); else history.pushState(null, "", url);
  route();
}

class ApiError extends Error {
  constructor(status, body) { super(body.error || `HTTP ${status}`); this.status = status; this.body = body; }
}

async function api(path, query) {
  const r = await fetch(viewUrl(path, query), { headers: { Accept: "application/json" } });
  let body;
  try { body = await r.json(); } catch (e) { body = { error: `HTTP ${r.status}: not JSON` }; }
  if (!r.ok) throw new ApiError(r.status, body);
  return body;
}

// ---- banners: honest answers ----------------------------------------------------------------
function clearBanners() { $("#banners").replaceChildren(); }

function banner(kind, title, items = [], extra = null) {
  const b = el("div", { class: `banner ${kind}`, role: kind === "note" ? "status" : "alert", "data-kind": kind },
    el("strong", { text: title }), items.length ? el("ul", {}, items.map((i) => el("li", {}, i))) : null, extra);
  $("#banners").append(b);
  return b;
}

// An answer's failed brokers, expired ranges and notes, each said once at the top of the view.
function honesty(answer, retryUrl) {
  const failed = answer.failedBrokers || [];
  if (failed.length) {
    const names = [...new Set(failed.map((f) => f.broker || f.topic))];
    const b = banner("incomplete", `Incomplete answer: ${names.length === 1 ? "broker" : "brokers"} ${names.join(", ")} did not answer; the result may miss messages.`,
      failed.map((f) => `${f.broker ? "broker " + f.broker : "topic " + f.topic}${f.topic && f.broker ? " (topic " + f.topic + ")" : ""}: ${f.code}${f.message ? ": " + f.message : ""}`),
      retryUrl ? el("p", {}, el("a", { href: retryUrl, class: "button secondary", id: "retry" }, "Retry this page")) : null);
    b.id = "incomplete-banner";
    b.dataset.brokers = names.join(",");
  }
  const expired = answer.expired || [];
  if (expired.length) {
    const b = banner("expired", "Messages of this window are gone: retention deleted the CommitLog segments that held them (no retry brings them back).",
      expired.map((e) => `broker ${e.broker}: physical offsets [${e.fromPhysicalOffset}, ${e.toPhysicalOffset})` +
        (e.storedAtOrBefore ? `, stored at or before ${fmtTime(e.storedAtOrBefore)}` : "") +
        (e.queues && e.queues.length ? `; queue offsets gone: ${e.queues.map((q) => `${q.topic}/${q.queueId} [${q.fromQueueOffset}, ${q.toQueueOffset})`).join(", ")}` : "")));
    b.id = "expired-banner";
  }
  if (!failed.length && !expired.length && answer.complete === false && !(answer.notes || []).length) {
    banner("incomplete", "Incomplete answer: the router says this result may miss messages.");
  }
  const notes = answer.notes || [];
  if (notes.length) banner("note", "Notes from the router", notes);
}

function showError(err, form) {
  if (!(err instanceof ApiError)) { banner("error", `The console could not be reached: ${err.message}`); return; }
  const body = err.body || {};
  const titles = { 400: "Bad input", 401: "Refused by the routers: not signed in as an account they know", 403: "Refused by access control", 404: "Not found", 503: "Unavailable" };
  const refused = err.status === 401 || err.status === 403; // a refusal, never shown as an empty answer
  const b = banner(refused ? "refused" : "error", `${titles[err.status] || "Error " + err.status}${body.field ? " (" + body.field + ")" : ""}: ${body.error || ""}`);
  b.id = "error-banner";
  b.dataset.status = String(err.status);
  if (refused) b.append(loginLink()); // access.js
  if (body.field && form) {
    const input = form.querySelector(`[name="${body.field}"]`);
    if (input) {
      input.classList.add("invalid");
      input.after(el("span", { class: "field-error", text: body.error }));
    }
  }
}

// ---- message tables -------------------------------------------------------------------------
function messageHref(m) {
  return viewUrl("/message", { topic: m.topic, broker: m.brokerName, queue: m.queueId, offset: m.queueOffset });
}

function messageTable(messages, id) {
  const zone = zoneName();
  return el("table", { id, class: "messages" },
    el("thead", {}, el("tr", {}, ["Store time", "Topic", "Keys", "Tags", "Broker / queue", "Queue offset", "Message id", "Body preview"].map((h) =>
      el("th", { title: h === "Store time" ? zone : null }, h)))),
    el("tbody", {}, messages.map((m) => el("tr", {
      class: "msg-row", "data-offset-msg-id": m.offsetMsgId, "data-unique-key": m.uniqueKey, "data-keys": m.keys.join(" "),
      "data-tags": m.tags, "data-broker": m.brokerName, "data-queue": m.queueId, "data-queue-offset": m.queueOffset, "data-store-ms": m.storeTimestamp,
    },
      el("td", { class: "mono time" }, el("a", { href: messageHref(m), class: "msg-link" }, fmtTime(m.storeTimestamp))),
      el("td", {}, m.topic),
      el("td", { class: "mono" }, m.keys.join(" ")),
      el("td", {}, m.tags ? el("span", { class: "tag" }, m.tags) : ""),
      el("td", {}, `${m.brokerName} / ${m.queueId}`),
      el("td", { class: "mono" }, String(m.queueOffset)),
      el("td", { class: "mono", title: `offsetMsgId ${m.offsetMsgId}` }, m.uniqueKey || m.offsetMsgId),
      el("td", { class: "preview", title: m.bodyPreview }, m.bodyPreview + (m.scheduled ? " (scheduled)" : "")),
    ))));
}

function windowInputs(begin, end) {
  return [
    el("label", {}, "From (" + zoneName() + ")", el("input", { type: "datetime-local", step: "0.001", name: "begin", value: toLocalInput(begin) })),
    el("label", {}, "To", el("input", { type: "datetime-local", step: "0.001", name: "end", value: toLocalInput(end) })),
  ];
}

// ---- Search ---------------------------------------------------------------------------------
const KIND_WORDS = { offsetMsgId: "an offsetMsgId", uniqueKey: "a unique key (RocketMQ 4 message id)", uniqueKeyV5: "a RocketMQ 5 message id (unique key)", key: "a key" };

async function searchView(gen) {
  const p = params();
  const form = el("form", { class: "query", id: "search-form" },
    el("label", {}, "offsetMsgId, message id (unique key), or key", el("input", { id: "q", name: "q", value: p.get("q") || "", placeholder: "7F00000100002A9F0000000000000000 or order-1001", autofocus: true })),
    el("label", {}, "Topic (needed for a key)", el("input", { id: "search-topic", name: "topic", value: p.get("topic") || "", list: "topic-list" })),
    ...windowInputs(p.get("begin"), p.get("end")),
    el("button", { type: "submit", id: "search-button" }, "Search"),
    el("datalist", { id: "topic-list" }));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    go(viewUrl("/search", { q: f.get("q").trim(), topic: f.get("topic").trim(), begin: fromLocalInput(f.get("begin")), end: fromLocalInput(f.get("end")) }));
  });
  const out = el("div", { id: "search-result" });
  $("#view").replaceChildren(el("h1", { text: "Find a message" }), form, out);
  fillTopics();
  const q = p.get("q");
  if (!q) return;
  try {
    const query = { q, topic: p.get("topic") || "", begin: p.get("begin") || "", end: p.get("end") || "", token: p.get("token") || "" };
    const a = await api("/api/search", query);
    if (gen !== generation) return;
    const retry = a.failedBrokers.length ? viewUrl("/search", { ...query, token: a.retryToken }) : null; // this page again
    honesty(a, retry);
    out.append(el("div", { class: "kind", id: "search-kind", "data-kind": a.kind },
      "Took it as ", el("b", {}, KIND_WORDS[a.kind] || a.kind), `: ${a.reading}.`,
      (a.tried || []).length ? el("div", { class: "muted" }, "Also tried: " + a.tried.join("; ")) : null,
      a.searchedTopics && !p.get("topic") ? el("div", { class: "muted" }, `No topic given: searched every topic (${a.searchedTopics.length}).`) : null));
    out.append(el("p", { id: "search-count", "data-count": a.messages.length },
      a.messages.length ? `${a.messages.length} message${a.messages.length === 1 ? "" : "s"}${a.nextToken ? " on this page" : ""}.` : "No message found."));
    if (a.messages.length) out.append(messageTable(a.messages, "search-table"));
    if (a.nextToken) out.append(el("div", { class: "pager" }, el("a", { class: "button", id: "next-page", href: viewUrl("/search", { ...query, token: a.nextToken }) }, "Next page")));
  } catch (err) {
    if (gen === generation) showError(err, form);
  }
}

async function fillTopics() {
  try {
    const t = await api("/api/topics", {});
    const list = $("#topic-list");
    if (list) list.replaceChildren(...t.topics.map((x) => el("option", { value: x })));
  } catch (e) { /* the view's own query says what is wrong */ }
}

// ---- Browse + histogram -----------------------------------------------------------------------
async function browseView(gen) {
  const p = params();
  const topic = p.get("topic") || "";
  let begin = p.get("begin") || "", end = p.get("end") || "";
  const tags = p.get("tags") || "", order = p.get("order") || "newest", pageSize = p.get("pageSize") || "50";
  const page = Number(p.get("page") || "1"), token = p.get("token") || "";
  const form = el("form", { class: "query", id: "browse-form" },
    el("label", {}, "Topic", el("input", { id: "browse-topic", name: "topic", value: topic, list: "topic-list", required: true })),
    ...windowInputs(begin, end),
    el("label", {}, "Tags (TagA || TagB, * for all)", el("input", { id: "browse-tags", name: "tags", value: tags, placeholder: "*" })),
    el("label", {}, "Order", el("select", { name: "order", id: "browse-order" },
      el("option", { value: "newest", selected: order === "newest" }, "newest first"), el("option", { value: "oldest", selected: order === "oldest" }, "oldest first"))),
    el("label", {}, "Page size", el("input", { type: "number", min: "1", max: "1024", name: "pageSize", id: "browse-page-size", value: pageSize })),
    el("button", { type: "submit", id: "browse-button" }, "Browse"),
    el("datalist", { id: "topic-list" }));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    go(viewUrl("/browse", { topic: f.get("topic").trim(), begin: fromLocalInput(f.get("begin")), end: fromLocalInput(f.get("end")), tags: f.get("tags").trim(), order: f.get("order"), pageSize: f.get("pageSize") }));
  });
  const histBox = el("div", { class: "histogram-box", id: "histogram-box" });
  const out = el("div", { id: "browse-result" });
  $("#view").replaceChildren(el("h1", { text: "Browse a topic by store time" }), form, histBox, out);
  fillTopics();
  if (!topic) return;
  try {
    const query = { topic, begin, end, tags, order, pageSize, token };
    const a = await api("/api/browse", query);
    if (gen !== generation) return;
    if (!end || !begin) { // the window the console fixed (end: now), kept in the URL so pages and links see the same window
      begin = String(a.window.begin); end = String(a.window.end);
      history.replaceState(null, "", viewUrl("/browse", { ...query, begin, end, page: page > 1 ? page : "" }));
      form.querySelector("[name=begin]").value = toLocalInput(begin);
      form.querySelector("[name=end]").value = toLocalInput(end);
    }
    const base = { topic, begin, end, tags, order, pageSize };
    honesty(a, a.failedBrokers.length ? viewUrl("/browse", { ...base, token: a.retryToken, page: page > 1 ? page : "" }) : null); // this page again
    out.append(el("p", { id: "browse-summary", "data-count": a.messages.length, "data-page": page },
      `Page ${page}: ${a.messages.length} message${a.messages.length === 1 ? "" : "s"} of ${topic}${tags && tags !== "*" ? " with tags " + tags : ""}, ` +
      `stored ${fmtTime(a.window.begin)} to ${fmtTime(a.window.end)} (${zoneName()}), ${order} first` + (a.nextToken ? "; more follow." : "; the end of the window.")));
    const table = messageTable(a.messages, "browse-table");
    out.append(table);
    if (topic.startsWith(DLQ_PREFIX)) deadLetterControls(gen, out, a.messages, table); // dead_letters.js
    out.append(el("div", { class: "pager" },
      page > 1 ? el("a", { class: "button secondary", id: "first-page", href: viewUrl("/browse", base) }, "First page") : null,
      a.nextToken ? el("a", { class: "button", id: "next-page", href: viewUrl("/browse", { ...base, token: a.nextToken, page: page + 1 }) }, `Next page (${page + 1})`) : el("span", { class: "muted", id: "last-page" }, "Last page")));
    histogram(gen, histBox, base);
  } catch (err) {
    if (gen === generation) showError(err, form);
  }
}

// Messages per interval across the window, counted on the browse itself (exact; the API
// answers slice by slice with a token to go on). Drag across it to zoom the window.
async function histogram(gen, box, base) {
  const buckets = 60;
  const status = el("div", { id: "histogram-status", class: "muted" }, "Counting messages per interval…");
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.id = "histogram";
  box.replaceChildren(el("div", {}, el("strong", {}, "Messages per interval"), " — drag across the chart to zoom the window"), svg, status);
  let counts = null, edges = null, total = 0, token = "", slices = 0;
  for (;;) {
    let h;
    try {
      h = await api("/api/histogram", { topic: base.topic, begin: base.begin, end: base.end, tags: base.tags, buckets, token });
    } catch (err) {
      if (gen === generation) { status.textContent = `The count stopped: ${err.message}`; svg.dataset.done = "error"; }
      return;
    }
    if (gen !== generation) return;
    slices++;
    if (!counts) { counts = h.counts.slice(); edges = h.edges; } else h.counts.forEach((c, i) => { counts[i] += c; });
    total += h.counted;
    drawHistogram(svg, counts, edges, base);
    svg.dataset.total = String(total);
    if (h.failedBrokers.length) {
      status.textContent = `Count incomplete at ${total} messages: ${h.failedBrokers.map((f) => `broker ${f.broker} did not answer (${f.code})`).join("; ")}.`;
      status.classList.add("incomplete");
      svg.dataset.done = "incomplete";
      return;
    }
    if (h.done) {
      const gone = (h.expired || []).length ? " Messages retention deleted are not counted (see the banner)." : "";
      status.textContent = `Exact: ${total} message${total === 1 ? "" : "s"} counted, every message of the window read (not sampled); ${edges.length - 1} intervals of ${fmtSpan(h.bucketMs)}.${gone}`;
      svg.dataset.done = "true";
      return;
    }
    status.textContent = `Counting… ${total} messages so far (every message of the window is read; not sampled).`;
    token = h.nextToken;
  }
}

function fmtSpan(ms) {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms % 1000 ? 3 : 0)} s`;
  if (ms < 3600000) return `${(ms / 60000).toFixed(ms % 60000 ? 2 : 0)} min`;
  return `${(ms / 3600000).toFixed(2)} h`;
}

function drawHistogram(svg, counts, edges, base) {
  const NS = "http://www.w3.org/2000/svg";
  const W = 1000, H = 140, top = 8, bottom = 22;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const max = Math.max(1, ...counts);
  const bw = W / counts.length;
  const nodes = [];
  counts.forEach((c, i) => {
    const h = (c / max) * (H - top - bottom);
    const r = document.createElementNS(NS, "rect");
    r.setAttribute("class", "bar");
    r.setAttribute("x", String(i * bw + 0.5));
    r.setAttribute("width", String(Math.max(0.5, bw - 1)));
    r.setAttribute("y", String(H - bottom - h));
    r.setAttribute("height", String(h));
    r.dataset.count = String(c);
    r.dataset.from = String(edges[i]);
    r.dataset.to = String(edges[i + 1] - 1);
    const t = document.createElementNS(NS, "title");
    t.textContent = `${c} message${c === 1 ? "" : "s"}, ${fmtTime(edges[i])} – ${fmtTime(edges[i + 1] - 1)}`;
    r.append(t);
    nodes.push(r);
  });
  for (const [x, anchor, ms] of [[2, "start", edges[0]], [W - 2, "end", edges[edges.length - 1] - 1]]) {
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", String(x)); t.setAttribute("y", String(H - 6)); t.setAttribute("text-anchor", anchor);
    t.textContent = fmtTime(ms);
    nodes.push(t);
  }
  const maxLabel = document.createElementNS(NS, "text");
  maxLabel.setAttribute("x", "2"); maxLabel.setAttribute("y", "10");
  maxLabel.textContent = `max ${max} / interval`;
  nodes.push(maxLabel);
  const sel = document.createElementNS(NS, "rect");
  sel.setAttribute("class", "selection"); sel.setAttribute("y", "0"); sel.setAttribute("height", String(H - bottom)); sel.setAttribute("width", "0");
  nodes.push(sel);
  svg.replaceChildren(...nodes);
  // drag to zoom: the time under the pointer, from the chart's own edges
  const timeAt = (clientX) => {
    const box = svg.getBoundingClientRect();
    const frac = Math.min(1, Math.max(0, (clientX - box.left) / box.width));
    return Math.round(edges[0] + frac * (edges[edges.length - 1] - edges[0]));
  };
  const xAt = (clientX) => { const box = svg.getBoundingClientRect(); return Math.min(W, Math.max(0, ((clientX - box.left) / box.width) * W)); };
  svg.onpointerdown = (ev) => {
    const startX = xAt(ev.clientX), startT = timeAt(ev.clientX);
    svg.setPointerCapture(ev.pointerId);
    svg.onpointermove = (mv) => {
      const x = xAt(mv.clientX);
      sel.setAttribute("x", String(Math.min(x, startX))); sel.setAttribute("width", String(Math.abs(x - startX)));
    };
    svg.onpointerup = (up) => {
      svg.onpointermove = null; svg.onpointerup = null;
      const endT = timeAt(up.clientX);
      const lo = Math.min(startT, endT), hi = Math.max(startT, endT);
      if (hi - lo < 1 || Math.abs(xAt(up.clientX) - startX) < 3) { sel.setAttribute("width", "0"); return; }
      go(viewUrl("/browse", { ...base, begin: String(lo), end: String(hi) }));
    };
  };
}

// ---- Message page ---------------------------------------------------------------------------
const FIELD_LABELS = [
  ["topic", "Topic"], ["tags", "Tags"], ["keys", "Keys"], ["uniqueKey", "Message id (unique key, UNIQ_KEY)"], ["offsetMsgId", "offsetMsgId"],
  ["brokerName", "Broker"], ["queueId", "Queue id"], ["queueOffset", "Queue offset"], ["commitLogOffset", "CommitLog offset"],
  ["storeSize", "Store size (bytes)"], ["bodySize", "Body size (bytes)"], ["bornTimestamp", "Born time"], ["bornHost", "Born host"],
  ["storeTimestamp", "Store time"], ["storeHost", "Store host"], ["sysFlag", "System flag"], ["flag", "Flag"], ["reconsumeTimes", "Reconsume times"],
  ["preparedTransactionOffset", "Prepared transaction offset"], ["bodyCrc", "Body CRC"], ["scheduled", "Scheduled (delayed)"],
  ["deliverTimestamp", "Deliver time"], ["realTopic", "Real topic"],
];
const TIME_FIELDS = new Set(["bornTimestamp", "storeTimestamp", "deliverTimestamp"]);
const HEX_LIMIT = 64 * 1024;

async function messageView(gen) {
  const p = params();
  const query = p.get("id") ? { id: p.get("id") } : { topic: p.get("topic") || "", broker: p.get("broker") || "", queue: p.get("queue") || "", offset: p.get("offset") || "" };
  $("#view").replaceChildren(el("h1", { text: "Message" }), el("p", { class: "muted", text: "Loading…" }));
  let a;
  try {
    a = await api("/api/message", query);
  } catch (err) {
    if (gen === generation) { $("#view").replaceChildren(el("h1", { text: "Message" })); showError(err, null); }
    return;
  }
  if (gen !== generation) return;
  const m = a.message;
  const bytes = Uint8Array.from(atob(m.bodyBase64), (c) => c.charCodeAt(0));
  const fields = el("table", { id: "fields" }, el("tbody", {}, FIELD_LABELS.map(([k, label]) => {
    let v = m[k];
    if (TIME_FIELDS.has(k)) v = v ? `${fmtTime(v)} (${v})` : "";
    else if (Array.isArray(v)) v = v.join(" ");
    else if (typeof v === "boolean") v = v ? "yes" : "no";
    return el("tr", { "data-field": k }, el("th", {}, label), el("td", { class: "mono" }, String(v ?? "")));
  })));
  const props = el("table", { id: "properties" }, el("thead", {}, el("tr", {}, el("th", {}, "Property"), el("th", {}, "Value"))),
    el("tbody", {}, m.properties.map(([k, v]) => el("tr", { "data-name": k }, el("td", { class: "mono" }, k), el("td", { class: "mono" }, v)))));
  const stored = a.stored;
  const where = el("p", { id: "stored" }, `Stored on broker ${stored.broker} (store host ${stored.storeHost}), topic ${stored.topic} queue ${stored.queueId} at queue offset ${stored.queueOffset}; CommitLog offset ${stored.commitLogOffset}, ${stored.storeSize} bytes; offsetMsgId ${stored.offsetMsgId}. ` +
    (stored.segment ? `Segment file ${stored.segment.fileName}, at byte ${stored.segment.position} of it.` : `Segment file not known (${stored.segmentError.code}: ${stored.segmentError.message}).`));
  const bodyPre = el("pre", { class: "body", id: "body" });
  const bodyNote = el("p", { class: "muted", id: "body-note" });
  const tabs = el("div", { class: "tabs", id: "body-tabs" });
  const show = (mode) => {
    tabs.querySelectorAll("button").forEach((b) => b.classList.toggle("active", b.dataset.mode === mode));
    bodyPre.dataset.mode = mode;
    bodyNote.textContent = m.compressed ? "The body is stored compressed (system flag 0x1): shown as stored." : "";
    if (mode === "text") bodyPre.textContent = new TextDecoder("utf-8").decode(bytes);
    else if (mode === "json") {
      try { bodyPre.textContent = JSON.stringify(JSON.parse(new TextDecoder("utf-8").decode(bytes)), null, 2); } catch (e) { bodyPre.textContent = `Not JSON: ${e.message}`; }
    } else {
      bodyPre.textContent = hexdump(bytes.subarray(0, HEX_LIMIT));
      if (bytes.length > HEX_LIMIT) bodyNote.textContent = `Hex of the first ${HEX_LIMIT} of ${bytes.length} bytes; download the body for all of it.`;
    }
    const u = new URL(location.href); u.searchParams.set("body", mode); history.replaceState(null, "", u);
  };
  for (const [mode, label] of [["text", "Text"], ["json", "JSON (pretty)"], ["hex", "Hex"]]) tabs.append(el("button", { type: "button", "data-mode": mode, onclick: () => show(mode) }, label));
  const download = el("a", { class: "button secondary", id: "download", href: viewUrl("/api/body", query), download: `${m.offsetMsgId}.bin` }, `Download body (${bytes.length} bytes)`);
  const track = el("div", { id: "track" }, el("p", { class: "muted" }, "Asking the broker for each consumer group's status…"));
  $("#view").replaceChildren(
    el("h1", {}, "Message ", el("span", { class: "mono" }, m.uniqueKey || m.offsetMsgId)),
    where,
    el("div", { class: "grid" }, el("div", {}, el("h2", { text: "Fields" }), fields), el("div", {}, el("h2", { text: "Properties" }), props)),
    el("h2", { text: "Body" }), tabs, bodyNote, bodyPre, download,
    el("h2", { text: "Consume status per consumer group (TrackMessage)" }), track);
  let mode = p.get("body");
  if (!["text", "json", "hex"].includes(mode)) { mode = "text"; try { JSON.parse(new TextDecoder().decode(bytes)); mode = "json"; } catch (e) { /* text */ } }
  show(mode);
  messageHistory(gen, m); // message_history.js: the trace timeline and the copies, below the consume status
  try {
    const t = await api("/api/track", { topic: m.topic, broker: m.brokerName, queue: m.queueId, offset: m.queueOffset });
    if (gen !== generation) return;
    track.replaceChildren(t.groups.length ? el("table", { id: "track-table" },
      el("thead", {}, el("tr", {}, ["Consumer group", "State", "Online", "Source", "Detail"].map((h) => el("th", {}, h)))),
      el("tbody", {}, t.groups.map((g) => el("tr", { "data-group": g.group, "data-state": g.state },
        el("td", { class: "mono" }, g.group), el("td", { class: `state-${g.state}` }, g.state), el("td", {}, g.online ? "yes" : "no"), el("td", {}, g.source),
        el("td", {}, trackDetail(g)))))) : el("p", { id: "track-none" }, "No consumer group subscribes to this topic on its broker."));
  } catch (err) {
    if (gen === generation) track.replaceChildren(el("p", { class: "banner error", id: "track-error" }, `Consume status unavailable: ${err.message}`));
  }
}

function trackDetail(g) {
  const parts = [];
  if (g.attempt) parts.push(`attempt ${g.attempt}`);
  if (g.invisibleUntilMs) parts.push(`invisible until ${fmtTime(g.invisibleUntilMs)}`);
  if (g.consumedAtMs) parts.push(`acked at ${fmtTime(g.consumedAtMs)}`);
  if (g.deadLetteredAtMs) parts.push(`dead-lettered at ${fmtTime(g.deadLetteredAtMs)}`);
  if (g.dueAtMs) parts.push(`due at ${fmtTime(g.dueAtMs)}`);
  if (g.expression) parts.push(`subscribes ${g.expression}`);
  if (g.note) parts.push(g.note);
  return parts.join("; ");
}

function hexdump(bytes) {
  const lines = [];
  for (let i = 0; i < bytes.length; i += 16) {
    const row = bytes.subarray(i, i + 16);
    const hex = Array.from(row, (b) => pad(b.toString(16))).join(" ");
    const ascii = Array.from(row, (b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${i.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${ascii}`);
  }
  return lines.join("\n");
}

// ---- Cluster --------------------------------------------------------------------------------
async function clusterView(gen) {
  $("#view").replaceChildren(el("h1", { text: "Cluster" }), el("p", { class: "muted", text: "Loading…" }));
  try {
    const c = await api("/api/cluster", {});
    if (gen !== generation) return;
    const missing = c.brokers.filter((b) => b.missing);
    if (missing.length) banner("incomplete", `Missing: ${missing.map((b) => b.brokerName).join(", ")} stopped heartbeating; queries of their topics are incomplete until they are back.`);
    $("#view").replaceChildren(el("h1", { text: "Cluster" }),
      el("p", {}, `Routers: ${c.routers}`),
      el("table", { id: "brokers" },
        el("thead", {}, el("tr", {}, ["Broker", "Cluster", "State", "Commitlog", "Indexer", "Store host", "Remoting", "Last heartbeat", "Topics"].map((h) => el("th", {}, h)))),
        el("tbody", {}, c.brokers.map((b) => el("tr", { "data-broker": b.brokerName, "data-missing": b.missing },
          el("td", { class: "mono" }, b.brokerName), el("td", {}, b.clusterName), el("td", { class: b.missing ? "missing" : "" }, b.missing ? "missing" : "live"),
          el("td", { class: "mono" }, b.commitlogAddr), el("td", { class: "mono" }, b.indexerAddr), el("td", { class: "mono" }, b.storeHost),
          el("td", { class: "mono" }, b.remotingAddr), el("td", { class: "mono" }, fmtTime(b.lastHeartbeatMs)),
          el("td", {}, b.topics.map((t) => el("a", { class: "tag", href: viewUrl("/browse", { topic: t.topic }) }, `${t.topic} (${t.queueCount})`))))))),
      el("p", { class: "muted" }, `${c.topics.length} topics.`));
    await clusterStatus(gen); // cluster_status.js
  } catch (err) {
    if (gen === generation) { $("#view").replaceChildren(el("h1", { text: "Cluster" })); showError(err, null); }
  }
}

// ---- routing --------------------------------------------------------------------------------
let generation = 0;
const VIEWS = { "/": searchView, "/search": searchView, "/browse": browseView, "/message": messageView, "/cluster": clusterView };

async function route() {
  const gen = ++generation;
  clearBanners();
  document.body.dataset.state = "loading";
  const path = location.pathname in VIEWS ? location.pathname : "/search";
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", "/" + a.dataset.view === (path === "/" ? "/search" : path)));
  try {
    await VIEWS[path](gen);
  } finally {
    if (gen === generation) document.body.dataset.state = "ready";
  }
}

document.addEventListener("click", (ev) => {
  const a = ev.target.closest && ev.target.closest("a[href]");
  if (!a || a.hasAttribute("download") || a.target || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.button !== 0) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || !(url.pathname in VIEWS)) return;
  ev.preventDefault();
  go(url.pathname + url.search);
});
window.addEventListener("popstate", route);
window.addEventListener("DOMContentLoaded", () => {
  $("#zone").textContent = "Times: " + zoneName();
  $("#zone-footer").textContent = zoneName();
  api("/api/info", {}).then((i) => { $("#routers").textContent = "Routers: " + i.routers; }).catch(() => {});
  route();
});
