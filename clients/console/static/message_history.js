// The message page's history: its trace (queryMsgTraceById) as a timeline, and its copies (every
// stored message with its unique key: a message sent twice, its retries and dead letters),
// each linked. Loaded after app.js.
"use strict";

const TRACE_WORDS = { Pub: "sent", SubBefore: "delivered to a consumer", SubAfter: "consumed", EndTransaction: "transaction ended", Recall: "recalled" };

function messageHistory(gen, m) {
  const trace = el("div", { id: "trace" }, el("p", { class: "muted" }, "Looking for its trace…"));
  const copies = el("div", { id: "copies" }, el("p", { class: "muted" }, m.uniqueKey ? "Looking for every message with its unique key…" : "No unique key: no copies to look for."));
  $("#view").append(el("h2", { text: "Trace (queryMsgTraceById)" }), trace, el("h2", { text: "Copies (same unique key)" }), copies);
  showTrace(gen, trace, m);
  if (m.uniqueKey) showCopies(gen, copies, m);
  else copies.dataset.done = "true";
}

async function showTrace(gen, box, m) {
  let t;
  try { t = await api("/api/trace", { id: m.uniqueKey || m.offsetMsgId }); } catch (err) { if (gen === generation) { box.replaceChildren(el("p", { class: "banner error", id: "trace-error" }, `Trace unavailable: ${err.message}`)); box.dataset.done = "error"; } return; }
  if (gen !== generation) return;
  const notes = [];
  if (t.failedBrokers.length) notes.push(el("p", { class: "banner", "data-kind": "incomplete" }, `Incomplete: ${t.failedBrokers.map((f) => `broker ${f.broker} did not answer (${f.code}: ${f.message})`).join("; ")}.`));
  if (t.note) notes.push(el("p", { class: "muted" }, t.note));
  t.problems.forEach((p) => notes.push(el("p", { class: "muted" }, `A trace record that does not decode: ${p}`)));
  if (!t.contexts.length) {
    box.replaceChildren(el("p", { id: "trace-none" }, `No trace of ${t.msgId} in ${t.traceTopic}.`), ...notes);
    box.dataset.done = "true";
    return;
  }
  const t0 = t.contexts[0].timestamp;
  const span = Math.max(1, t.contexts[t.contexts.length - 1].timestamp + Math.max(0, t.contexts[t.contexts.length - 1].costTimeMs) - t0);
  box.replaceChildren(el("ol", { class: "timeline", id: "trace-timeline" }, t.contexts.map((c) => el("li", { "data-type": c.traceType, "data-group": c.group, "data-success": String(c.success), "data-ms": c.timestamp },
    el("span", { class: "when mono" }, fmtTime(c.timestamp)),
    el("span", { class: "offset mono" }, c.timestamp === t0 ? "" : `+${fmtSpan(c.timestamp - t0)}`),
    el("span", { class: "track" }, el("span", { class: `mark ${c.success ? "ok" : "failed"}`, style: `left: ${(100 * (c.timestamp - t0)) / span}%; width: ${Math.max(0.6, (100 * Math.max(0, c.costTimeMs)) / span)}%` })),
    el("span", { class: "what" }, el("b", {}, `${c.traceType}`), ` ${TRACE_WORDS[c.traceType] || ""} — ${c.traceType === "Pub" ? "producer" : "group"} ${c.group}, client ${c.clientHost}` +
      (c.costTimeMs ? `, took ${c.costTimeMs} ms` : "") + (c.timeInferred ? " (time: its delivery plus the time consuming took)" : "") + (c.retryTimes ? `, retry ${c.retryTimes}` : "") + (c.success ? "" : ", FAILED") +
      (c.storeHost ? `, store host ${c.storeHost}` : "") + (c.transactionState ? `, ${c.transactionState}` : ""))))), ...notes);
  box.dataset.done = "true";
}

async function showCopies(gen, box, m) {
  let c;
  try { c = await api("/api/copies", { uniqueKey: m.uniqueKey }); } catch (err) { if (gen === generation) { box.replaceChildren(el("p", { class: "banner error", id: "copies-error" }, `Copies unavailable: ${err.message}`)); box.dataset.done = "error"; } return; }
  if (gen !== generation) return;
  const table = messageTable(c.messages, "copies-table");
  table.querySelectorAll("tbody tr.msg-row").forEach((tr) => { if (tr.dataset.offsetMsgId === m.offsetMsgId) { tr.classList.add("this-copy"); tr.dataset.this = "true"; } });
  const failed = c.failedBrokers || [];
  box.replaceChildren(el("p", { id: "copies-count", "data-count": c.messages.length },
    c.messages.length === 1 ? "Stored once: no other message has its unique key." : `${c.messages.length} stored messages have unique key ${m.uniqueKey} (this one marked), searched in every topic (${(c.searchedTopics || []).length}).`),
    ...(failed.length ? [el("p", { class: "banner", "data-kind": "incomplete" }, `Incomplete: ${failed.map((f) => `${f.broker || "topic " + f.topic}: ${f.code}`).join("; ")}.`)] : []), // replaceChildren writes a null as the text "null"
    table);
  box.dataset.done = "true";
}
