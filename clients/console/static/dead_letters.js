// Dead letters: a %DLQ%<group> topic is browsed like any topic; on its pages each message can be
// selected and resent to the topic it was first consumed from. The console first asks for the
// plan (what goes where, what cannot be resent and why), the operator confirms it, and each
// resend's own new ids are shown. Loaded after app.js, whose helpers (el, api, banner) it uses.
"use strict";

const DLQ_PREFIX = "%DLQ%";
const ORIGIN_PROPS = ["RETRY_TOPIC", "DLQ_ORIGIN_TOPIC"];

async function apiPost(path, doc) {
  const r = await fetch(path, { method: "POST", headers: { Accept: "application/json", "Content-Type": "application/json" }, body: JSON.stringify(doc) });
  let body;
  try { body = await r.json(); } catch (e) { body = { error: `HTTP ${r.status}: not JSON` }; }
  if (!r.ok) throw new ApiError(r.status, body);
  return body;
}

function originTopic(m) {
  const props = Object.fromEntries(m.properties);
  for (const name of ORIGIN_PROPS) if (props[name]) return props[name];
  return "";
}

// Adds a selection column and the resend controls under a DLQ page's table.
function deadLetterControls(gen, out, messages, table) {
  const byId = new Map(messages.map((m) => [m.offsetMsgId, m]));
  table.querySelector("thead tr").prepend(el("th", {}, el("input", { type: "checkbox", id: "dlq-select-all", title: "Select every message of this page",
    onchange: (ev) => { table.querySelectorAll("input.dlq-select").forEach((c) => { c.checked = ev.target.checked; }); count(); } })));
  table.querySelector("thead tr").append(el("th", {}, "Original topic"));
  table.querySelectorAll("tbody tr.msg-row").forEach((tr) => {
    const m = byId.get(tr.dataset.offsetMsgId);
    tr.prepend(el("td", {}, el("input", { type: "checkbox", class: "dlq-select", value: tr.dataset.offsetMsgId, onchange: () => count() })));
    tr.append(el("td", { class: "mono" }, originTopic(m) || "(unknown)"));
  });
  const button = el("button", { type: "button", id: "resend-button", disabled: true }, "Resend selected…");
  const panel = el("div", { id: "resend-panel" });
  const count = () => {
    const n = table.querySelectorAll("input.dlq-select:checked").length;
    button.disabled = n === 0;
    button.textContent = n ? `Resend ${n} selected to the original topic…` : "Resend selected…";
  };
  button.addEventListener("click", () => planResend(gen, panel, [...table.querySelectorAll("input.dlq-select:checked")].map((c) => c.value)));
  out.append(el("div", { class: "dlq-tools" }, el("strong", {}, "Dead letters: "), "select messages, then resend them, each as a new message, to the topic they were first consumed from. ", button), panel);
}

async function planResend(gen, panel, ids) {
  panel.replaceChildren(el("p", { class: "muted" }, "Reading the selected dead letters…"));
  let plan;
  try { plan = await apiPost("/api/resend", { ids, confirm: false }); } catch (err) { panel.replaceChildren(el("p", { class: "banner error", id: "resend-error" }, `Cannot resend: ${err.message}`)); return; }
  if (gen !== generation) return;
  const ok = plan.results.filter((r) => r.toTopic);
  const confirm = el("button", { type: "button", id: "resend-confirm-button", disabled: ok.length === 0 }, `Confirm: resend ${ok.length} message${ok.length === 1 ? "" : "s"}`);
  const cancel = el("button", { type: "button", class: "secondary", id: "resend-cancel", onclick: () => panel.replaceChildren() }, "Cancel");
  confirm.addEventListener("click", () => doResend(gen, panel, ok.map((r) => r.offsetMsgId)));
  panel.replaceChildren(el("div", { class: "confirm", id: "resend-confirm" },
    el("p", {}, el("strong", {}, "Resend these dead letters?"), " Each is sent again as a new message (a new message id) with its body, keys, tags and properties; the dead letter stays where it is."),
    el("table", { id: "resend-plan" }, el("thead", {}, el("tr", {}, ["Dead letter (offsetMsgId)", "Keys", "Reconsumed", "Goes to"].map((h) => el("th", {}, h)))),
      el("tbody", {}, plan.results.map((r) => el("tr", { "data-offset-msg-id": r.offsetMsgId, "data-to-topic": r.toTopic || "", "data-refused": r.refused || "" },
        el("td", { class: "mono" }, r.offsetMsgId), el("td", { class: "mono" }, (r.keys || []).join(" ")), el("td", {}, String(r.reconsumeTimes ?? "")),
        el("td", { class: r.refused ? "missing" : "mono" }, r.toTopic || `not resent: ${r.refused}`))))),
    el("p", {}, confirm, " ", cancel)));
}

async function doResend(gen, panel, ids) {
  panel.replaceChildren(el("p", { class: "muted" }, `Resending ${ids.length}…`));
  let done;
  try { done = await apiPost("/api/resend", { ids, confirm: true }); } catch (err) { panel.replaceChildren(el("p", { class: "banner error", id: "resend-error" }, `Resend failed: ${err.message}`)); return; }
  if (gen !== generation) return;
  panel.replaceChildren(el("div", { id: "resend-done", "data-resent": done.resent, "data-refused": done.refused },
    el("p", {}, el("strong", {}, `Resent ${done.resent} of ${done.results.length}.`), done.refused ? ` ${done.refused} not resent (see below).` : ""),
    el("table", { id: "resend-results" }, el("thead", {}, el("tr", {}, ["Dead letter", "Sent to", "New message id (unique key)", "New offsetMsgId", "Stored at"].map((h) => el("th", {}, h)))),
      el("tbody", {}, done.results.map((r) => {
        const s = r.sent;
        return el("tr", { "data-offset-msg-id": r.offsetMsgId, "data-new-msg-id": s ? s.msgId : "", "data-new-offset-msg-id": s ? s.offsetMsgId : "", "data-to-topic": s ? s.topic : "" },
          el("td", { class: "mono" }, r.offsetMsgId),
          el("td", { class: "mono" }, s ? s.topic : ""),
          el("td", { class: "mono" }, s ? el("a", { href: viewUrl("/search", { q: s.msgId, topic: s.topic }), class: "new-msg-id" }, s.msgId) : (r.refused || (r.error ? `${r.error.code}: ${r.error.message}` : ""))),
          el("td", { class: "mono" }, s ? el("a", { href: viewUrl("/message", { id: s.offsetMsgId }) }, s.offsetMsgId) : ""),
          el("td", {}, s ? `${s.broker} / queue ${s.queueId} / offset ${s.queueOffset}` : ""));
      })))));
}
