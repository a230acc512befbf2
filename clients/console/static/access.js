// Quarry Console: logging in with an ACL account (access key and secret key), after app.js.
// The secret goes once, in a POST body, to the console, which keeps it server-side and signs
// this browser's calls to the routers with it; the browser holds only an HttpOnly cookie.
"use strict";

async function postJson(path, body) {
  const r = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(body), credentials: "same-origin" });
  let answer;
  try { answer = await r.json(); } catch (e) { answer = { error: `HTTP ${r.status}: not JSON` }; }
  if (!r.ok) throw new ApiError(r.status, answer);
  return answer;
}

// The header: who this browser's calls are signed as, and the way in or out.
async function showAccount() {
  const box = $("#account");
  if (!box) return;
  let s;
  try { s = await api("/api/session", {}); } catch (e) { box.replaceChildren(); return; }
  if (s.loggedIn) {
    box.replaceChildren(el("span", { id: "account-key", "data-access-key": s.accessKey }, `Signed in as ${s.accessKey}`), " ",
      el("button", { id: "logout", class: "secondary small", type: "button", onclick: logout }, "Log out"));
  } else {
    box.replaceChildren(el("a", { id: "login-link", href: viewUrl("/login", { next: location.pathname + location.search }) }, "Log in"));
  }
}

async function logout() {
  try { await postJson("/api/logout", {}); } finally { await showAccount(); go("/login", true); }
}

function loginLink() {
  const next = location.pathname === "/login" ? "/search" : location.pathname + location.search;
  return el("p", {}, el("a", { href: viewUrl("/login", { next }), class: "button secondary", id: "login-from-banner" }, "Log in with an account"));
}

// Only a path of this console is followed after logging in (never another site).
function nextPath() {
  const next = params().get("next") || "/search";
  return next.startsWith("/") && !next.startsWith("//") && !next.startsWith("/login") ? next : "/search";
}

async function loginView(gen) {
  // method=post: were the script ever not to run, the browser still never puts the secret in a URL.
  const form = el("form", { class: "query", id: "login-form", method: "post", action: "/api/login", autocomplete: "on" },
    el("label", {}, "Access key", el("input", { id: "access-key", name: "accessKey", autocomplete: "username", required: true })),
    el("label", {}, "Secret key", el("input", { id: "secret-key", name: "secretKey", type: "password", autocomplete: "current-password", required: true })),
    el("button", { id: "login-button", type: "submit" }, "Log in"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearBanners();
    form.querySelectorAll(".field-error").forEach((e) => e.remove());
    form.querySelectorAll(".invalid").forEach((e) => e.classList.remove("invalid"));
    try {
      const answer = await postJson("/api/login", { accessKey: $("#access-key").value, secretKey: $("#secret-key").value });
      $("#secret-key").value = "";
      await showAccount();
      go(nextPath());
      if (answer.note) banner("note", `Signed in as ${answer.accessKey}`, [answer.note]);
    } catch (err) {
      $("#secret-key").value = "";
      showError(err, form);
    }
  });
  $("#view").replaceChildren(el("h1", { text: "Log in" }),
    el("p", { class: "muted" }, "With access control on, the routers answer what this account may read. The secret key stays in the console's process: it signs this browser's calls and is never shown or logged."),
    form);
}

VIEWS["/login"] = loginView;
window.addEventListener("DOMContentLoaded", showAccount);
