// warren's management UI: a page per hash route, each fetching what it shows from the
// management API and refreshing every REFRESH_MS (RabbitMQ's statistics interval), a login
// with the broker's users. The map:
// - api.js: calls with basic auth; dom.js: elements without innerHTML; charts.js: uPlot charts
// - pages.js: overview, connections, channels, exchanges, queues and a queue's own page
// - admin.js: users, vhosts, permissions, policies, nodes

import { api, get, login, logout, loggedIn, ApiError } from "./api.js";
import { h } from "./dom.js";
import * as pages from "./pages.js";
import * as admin from "./admin.js";
import "./app.css";

// At least 0.5 s: a mistyped ?refresh must not make the page hammer the node.
const REFRESH_MS = Math.max(500, Number(new URLSearchParams(location.search).get("refresh")) || 5000);

const ROUTES = [
  ["overview", "Overview", pages.overview],
  ["connections", "Connections", pages.connections],
  ["channels", "Channels", pages.channels],
  ["exchanges", "Exchanges", pages.exchanges],
  ["queues", "Queues", pages.queues],
  ["admin", "Admin", admin.admin],
];

let current = null; // {route, page: {el, refresh?, destroy?}}
let timer = null;
let whoami = null;

function route() {
  const [name, ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  return { name: name || "overview", args: rest.map(decodeURIComponent) };
}

function loginPage(message) {
  const error = h("p.error", message || "");
  const el = h(
    "form.login#login",
    {
      onsubmit: async (e) => {
        e.preventDefault();
        const values = Object.fromEntries(new FormData(el).entries());
        login(values.username, values.password);
        try {
          whoami = await get("/api/whoami");
          show();
        } catch (err) {
          logout();
          error.textContent = err instanceof ApiError && err.status === 401 ? err.message : `Cannot log in: ${err.message}`;
        }
      },
    },
    h("h1", "warren"),
    h("label", "Username ", h("input", { name: "username", autocomplete: "username", required: true })),
    h("label", "Password ", h("input", { name: "password", type: "password", autocomplete: "current-password" })),
    h("button", { type: "submit" }, "Log in"),
    error,
  );
  return el;
}

function layout(r, content) {
  const nav = h(
    "nav",
    ROUTES.map(([name, label]) =>
      h("a", { href: `#/${name}`, class: r.name === name || (name === "queues" && r.name === "queue") ? "active" : null }, label),
    ),
    h(
      "span.who",
      `${whoami.name} (${whoami.tags})`,
      " ",
      h("a#logout", { href: "#", onclick: (e) => { e.preventDefault(); logout(); show(); } }, "Log out"),
    ),
  );
  return [h("header", h("span.brand", "warren"), nav), h("main", content)];
}

async function show() {
  clearInterval(timer);
  if (current && current.page.destroy) current.page.destroy();
  current = null;
  const root = document.getElementById("app");
  if (!loggedIn()) {
    root.replaceChildren(loginPage());
    return;
  }
  if (!whoami) {
    try {
      whoami = await get("/api/whoami");
    } catch (err) {
      logout();
      root.replaceChildren(loginPage(err.message));
      return;
    }
  }
  const r = route();
  const make = r.name === "queue" ? pages.queue : (ROUTES.find(([n]) => n === r.name) || ROUTES[0])[2];
  const page = make({ args: r.args, whoami, api, go: (hash) => (location.hash = hash) });
  current = { route: r, page };
  root.replaceChildren(...layout(r, page.el));
  const refresh = async () => {
    if (!page.refresh) return;
    try {
      await page.refresh();
      page.el.dataset.refreshed = String(Date.now());
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) {
        logout();
        whoami = null;
        show();
      }
    }
  };
  await refresh();
  timer = setInterval(refresh, REFRESH_MS);
}

window.addEventListener("hashchange", show);
window.addEventListener("DOMContentLoaded", show);
