// The cluster page's status sections: each broker's store (disk use, offsets, damaged records,
// problems, what retention deleted) and index (lag), the topics' queues with their offsets, the
// consumer groups with their lag, and each group's dead letters. Loaded after app.js.
"use strict";

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0, v = Number(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${i ? v.toFixed(1) : v} ${units[i]}`;
}

function partError(e) { return e ? `${e.code}: ${e.message}` : ""; }

async function clusterStatus(gen) {
  const box = el("div", { id: "cluster-status" }, el("p", { class: "muted" }, "Asking each broker for its store, index, queues and consumer groups…"));
  $("#view").append(box);
  let s;
  try { s = await api("/api/status", {}); } catch (err) { if (gen === generation) box.replaceChildren(el("p", { class: "banner error", id: "status-error" }, `Status unavailable: ${err.message}`)); return; }
  if (gen !== generation) return;
  if (s.unanswered.length) {
    const names = [...new Set(s.unanswered.map((u) => u.broker))];
    const b = banner("incomplete", `Incomplete status: ${names.join(", ")} did not answer every question.`,
      s.unanswered.map((u) => `broker ${u.broker} (${u.part}): ${u.code}: ${u.message}`));
    b.dataset.brokers = names.join(",");
  }
  const stores = el("table", { id: "store-status" },
    el("thead", {}, el("tr", {}, ["Broker", "CommitLog", "Disk (segments)", "Flush", "Index", "Damaged records", "Problems", "Expired (retention)"].map((h) => el("th", {}, h)))),
    el("tbody", {}, s.brokers.map((b) => {
      const st = b.store, ix = b.index;
      return el("tr", { "data-broker": b.brokerName, "data-damaged": st ? st.damaged.length : "", "data-index-lag-bytes": ix ? ix.lagBytes : "",
        "data-written-bytes": st ? st.writtenBytes : "", "data-expired-to": st && st.expired ? st.expired.toPhysicalOffset : "" },
        el("td", { class: "mono" }, b.brokerName),
        el("td", { class: "mono" }, st ? `[${st.minOffset}, ${st.maxOffset})` + (st.readOnly ? " read-only" : "") + (st.recovered ? ", recovered after an unclean stop" : "") : partError(b.error || b.storeError)),
        el("td", {}, st ? `${fmtBytes(st.writtenBytes)} written of ${fmtBytes(st.allocatedBytes)} (${st.segments} segment${st.segments === 1 ? "" : "s"})` : ""),
        el("td", {}, st ? st.flushMode : ""),
        el("td", { class: "index-lag" }, ix ? `${ix.lagBytes ? fmtBytes(ix.lagBytes) + " behind" + (ix.lagMs ? ` (${fmtSpan(ix.lagMs)})` : "") : "caught up"}; ${ix.entries} entries in ${ix.files} file${ix.files === 1 ? "" : "s"}` +
          (ix.tailConnected ? "" : "; not tailing the log") + (ix.problems.length ? `; problems: ${ix.problems.join("; ")}` : "") : partError(b.indexError)),
        el("td", { class: st && st.damaged.length ? "missing" : "" }, st ? (st.damaged.length ? el("ul", {}, st.damaged.map((d) => el("li", { class: "mono" }, d))) : "none reported") : ""),
        el("td", {}, st ? (st.problems.length ? el("ul", {}, st.problems.map((p) => el("li", {}, p))) : "none") : ""),
        el("td", { class: "mono" }, st ? (st.expired ? `physical offsets [${st.expired.fromPhysicalOffset}, ${st.expired.toPhysicalOffset}) deleted` : "nothing deleted") : ""));
    })));
  const queues = s.brokers.flatMap((b) => (b.queues || []).map((q) => ({ ...q, broker: b.brokerName })));
  queues.sort((x, y) => x.topic.localeCompare(y.topic) || x.broker.localeCompare(y.broker) || x.queueId - y.queueId);
  const queueTable = el("table", { id: "queue-offsets" },
    el("thead", {}, el("tr", {}, ["Topic", "Broker", "Queue", "Min offset", "Max offset", "Messages held"].map((h) => el("th", {}, h)))),
    el("tbody", {}, queues.map((q) => el("tr", { "data-topic": q.topic, "data-broker": q.broker, "data-queue": q.queueId, "data-min": q.minOffset, "data-max": q.maxOffset },
      el("td", {}, el("a", { href: viewUrl("/browse", { topic: q.topic }) }, q.topic)), el("td", { class: "mono" }, q.broker), el("td", {}, String(q.queueId)),
      el("td", { class: "mono" }, String(q.minOffset)), el("td", { class: "mono" }, String(q.maxOffset)), el("td", { class: "mono" }, String(q.maxOffset - q.minOffset))))));
  const dlqOf = new Map(s.deadLetters.map((d) => [d.group, d]));
  const groups = el("table", { id: "consumer-groups" },
    el("thead", {}, el("tr", {}, ["Consumer group", "Topic", "Kept by", "Lag (messages)", "Queues", "Brokers", "Dead letters"].map((h) => el("th", {}, h)))),
    el("tbody", {}, s.groups.map((g) => {
      const d = dlqOf.get(g.group);
      return el("tr", { "data-group": g.group, "data-topic": g.topic, "data-lag": g.lag, "data-source": g.source },
        el("td", { class: "mono" }, g.group), el("td", {}, g.topic), el("td", {}, g.source === "pop" ? "RocketMQ 5 (pop)" : "committed offsets"),
        el("td", { class: "mono" }, String(g.lag)), el("td", {}, String(g.queues)), el("td", { class: "mono" }, g.brokers.join(", ")),
        el("td", {}, d ? el("a", { href: viewUrl("/browse", { topic: d.topic }), class: "dlq-link" }, `${d.messages} in ${d.topic}`) : ""));
    })));
  const dead = el("table", { id: "dead-letters" },
    el("thead", {}, el("tr", {}, ["Consumer group", "Dead-letter topic", "Messages held", ""].map((h) => el("th", {}, h)))),
    el("tbody", {}, s.deadLetters.map((d) => el("tr", { "data-group": d.group, "data-topic": d.topic, "data-messages": d.messages },
      el("td", { class: "mono" }, d.group), el("td", { class: "mono" }, d.topic), el("td", { class: "mono" }, String(d.messages)),
      el("td", {}, el("a", { class: "button secondary dlq-link", href: viewUrl("/browse", { topic: d.topic, order: "newest" }) }, "Browse and resend"))))));
  box.replaceChildren(
    el("h2", { text: "Store status per broker" }), stores,
    el("h2", { text: "Consumer groups" }), s.groups.length ? groups : el("p", { class: "muted", id: "no-groups" }, "No consumer group holds an offset on any broker."),
    el("h2", { text: "Dead letters" }), s.deadLetters.length ? dead : el("p", { class: "muted", id: "no-dead-letters" }, "No dead-letter topic (%DLQ%<group>) on any broker."),
    el("h2", { text: "Topics: queues and offsets" }), queueTable);
  box.dataset.done = "true";
}
