// Building the DOM without innerHTML: every text the broker returns (queue names, payloads)
// goes in as a text node, so nothing a client named can run in the operator's browser.

/** h("tag.class#id", {attr: value, onclick: fn}, ...children) */
export function h(spec, attrs, ...children) {
  const [tagAndClasses, id] = spec.split("#");
  const [tag, ...classes] = tagAndClasses.split(".");
  const el = document.createElement(tag || "div");
  if (id) el.id = id;
  if (classes.length) el.className = classes.join(" ");
  const isAttrs = attrs !== null && typeof attrs === "object" && !(attrs instanceof Node) && !Array.isArray(attrs);
  if (attrs !== undefined && attrs !== null && !isAttrs) {
    children.unshift(attrs);
    attrs = null;
  }
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "value") el.value = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** A table: `columns` is [[heading, item => cell]]. */
export function table(columns, items, attrs) {
  return h(
    "table",
    attrs || {},
    h("thead", h("tr", columns.map(([head]) => h("th", head)))),
    h(
      "tbody",
      items.length
        ? items.map((item) => h("tr", columns.map(([, cell]) => h("td", cell(item)))))
        : h("tr", h("td.empty", { colspan: columns.length }, "(none)")),
    ),
  );
}

/** A form whose submit calls `action(values)`; errors and results show beside it. */
export function form(id, fields, label, action) {
  const status = h("span.status");
  const el = h(
    "form.inline#" + id,
    {
      onsubmit: async (e) => {
        e.preventDefault();
        const values = Object.fromEntries(new FormData(el).entries());
        status.textContent = "";
        status.className = "status";
        try {
          const done = await action(values);
          status.textContent = done || "Done.";
          status.className = "status ok";
        } catch (err) {
          status.textContent = err.message;
          status.className = "status error";
        }
      },
    },
    fields,
    h("button", { type: "submit" }, label),
    status,
  );
  return el;
}

export function field(label, name, attrs) {
  return h("label", label, " ", h("input", { name, ...attrs }));
}

export function select(label, name, options) {
  return h("label", label, " ", h("select", { name }, options.map((o) => h("option", { value: o }, o))));
}

export function fmtRate(r) {
  return r === undefined || r === null ? "" : `${Number(r).toFixed(1)}/s`;
}

export function fmtCount(n) {
  return n === undefined || n === null ? "" : Number(n).toLocaleString("en");
}

export function fmtBytes(n) {
  if (n === undefined || n === null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${i ? v.toFixed(1) : v} ${units[i]}`;
}

/** An uptime in ms as RabbitMQ's UI shows it: "3d 4h", "5h 12m", "40m 3s". */
export function fmtUptime(ms) {
  const s = Math.floor(Number(ms) / 1000);
  const [d, h, m] = [Math.floor(s / 86400), Math.floor((s % 86400) / 3600), Math.floor((s % 3600) / 60)];
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  return `${m}m ${s % 60}s`;
}
