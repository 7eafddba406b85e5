// The overview, the client listings, exchanges and queues (paged and filtered by the server,
// so 10,000 queues cost one page per refresh), and a queue's own page.

import { api, get, seg, ApiError } from "./api.js";
import { h, table, form, field, select, fmtRate, fmtCount } from "./dom.js";
import { RollingChart } from "./charts.js";

const PAGE_SIZE = 50;
const now = () => Date.now() / 1000;

/** A page whose `refresh` replaces the children of `body` with what `render` builds. */
function listing(title, render, top) {
  const body = h("div.listing");
  const el = h("section", h("h2", title), top || null, body);
  return {
    el,
    refresh: async () => body.replaceChildren(await render()),
  };
}

export function overview() {
  const totals = h("div.totals#totals");
  const rates = h("div.chart#rates-chart");
  const queued = h("div.chart#queued-chart");
  const el = h("section", h("h2", "Overview"), totals, h("div.charts", rates, queued));
  let ratesChart = null;
  let queuedChart = null;
  return {
    el,
    refresh: async () => {
      const o = await get("/api/overview");
      const ot = o.object_totals || {};
      const qt = o.queue_totals || {};
      const ms = o.message_stats || {};
      totals.replaceChildren(
        ...[
          ["Node", o.node],
          ["Version", `${o.rabbitmq_version} (warren ${o.product_version})`],
          ["Connections", fmtCount(ot.connections)],
          ["Channels", fmtCount(ot.channels)],
          ["Exchanges", fmtCount(ot.exchanges)],
          ["Queues", fmtCount(ot.queues)],
          ["Consumers", fmtCount(ot.consumers)],
          ["Ready", fmtCount(qt.messages_ready)],
          ["Unacked", fmtCount(qt.messages_unacknowledged)],
        ].map(([k, v]) => h("div.total", h("span.k", k), h("span.v", v))),
      );
      ratesChart = ratesChart || new RollingChart(rates, "Message rates (/s)", ["publish", "deliver/get", "ack"]);
      queuedChart = queuedChart || new RollingChart(queued, "Queued messages", ["ready", "unacked"]);
      const rate = (k) => (ms[`${k}_details`] || {}).rate || 0;
      ratesChart.push(now(), [rate("publish"), rate("deliver_get"), rate("ack")]);
      queuedChart.push(now(), [qt.messages_ready || 0, qt.messages_unacknowledged || 0]);
    },
    destroy: () => {
      if (ratesChart) ratesChart.destroy();
      if (queuedChart) queuedChart.destroy();
    },
  };
}

/** The cluster's connections, one page of the server's (`/api/connections?page=..`). */
export function connections() {
  return pagedListing("Connections", "connection", "/api/connections", "connections", [
    ["Name", (c) => c.name],
    ["Node", (c) => c.node],
    ["User", (c) => c.user],
    ["Vhost", (c) => c.vhost],
    ["Client", (c) => (c.client_properties || {}).product || ""],
    ["Channels", (c) => c.channels],
    ["TLS", (c) => (c.ssl ? "yes" : "no")],
    [
      "",
      (c) =>
        h("button.danger", {
          onclick: async () => {
            if (confirm(`Close ${c.name}?`)) await api("DELETE", `/api/connections/${seg(c.name)}`);
          },
        }, "Close"),
    ],
  ]);
}

/** The cluster's channels, one page of the server's (`/api/channels?page=..`). */
export function channels() {
  return pagedListing("Channels", "channel", "/api/channels", "channels", [
    ["Channel", (c) => c.name],
    ["Node", (c) => c.node],
    ["User", (c) => c.user],
    ["Vhost", (c) => c.vhost],
    ["Mode", (c) => [c.confirm ? "confirm" : "", c.transactional ? "tx" : ""].filter(Boolean).join(" ")],
    ["Prefetch", (c) => c.prefetch_count],
    ["Consumers", (c) => c.consumer_count],
    ["Unacked", (c) => c.messages_unacknowledged],
  ]);
}

/** One page of a server-side paged listing (`/api/queues`, `/api/exchanges`, `/api/connections`,
 * `/api/channels`), filtered by
 * name (substring or regex) on the server; `id` names its elements (`#${id}s`,
 * `#${id}-filter`, `#${id}-regex`, `#${id}-pager`). */
function pagedListing(title, id, path, noun, columns) {
  let page = 1;
  const again = () => { page = 1; view.refresh(); };
  const filter = h(`input#${id}-filter`, { placeholder: "Filter by name", oninput: again });
  const regex = h(`input#${id}-regex`, { type: "checkbox", onchange: again });
  const pager = h(`div.pager#${id}-pager`);
  const top = h("div", h("div.filter", filter, h("label", regex, " Regex")), pager);
  const view = listing(title, async () => {
    const ask = () => get(`${path}?${new URLSearchParams({ page, page_size: PAGE_SIZE, name: filter.value, use_regex: regex.checked, sort: "name" })}`);
    let r;
    try {
      r = await ask();
    } catch (e) {
      // The listing shrank under the page shown (connections closed, queues deleted) and the
      // server refuses a page past its end: show the first page rather than the error.
      if (!(e instanceof ApiError && e.status === 400 && page > 1)) throw e;
      page = 1;
      r = await ask();
    }
    const pages = Math.max(1, r.page_count);
    pager.replaceChildren(
      h("button", { disabled: page <= 1, onclick: () => { page -= 1; view.refresh(); } }, "‹ Previous"),
      ` Page ${r.page} of ${pages} — ${fmtCount(r.filtered_count)} of ${fmtCount(r.total_count)} ${noun} `,
      h("button", { disabled: page >= pages, onclick: () => { page += 1; view.refresh(); } }, "Next ›"),
    );
    return table(columns, r.items, { id: `${id}s` });
  }, top);
  return view;
}

export function exchanges() {
  return pagedListing("Exchanges", "exchange", "/api/exchanges", "exchanges", [
    ["Vhost", (x) => x.vhost],
    ["Name", (x) => x.name || "(AMQP default)"],
    ["Type", (x) => x.type],
    ["Features", (x) => [x.durable ? "D" : "", x.auto_delete ? "AD" : "", x.internal ? "I" : ""].filter(Boolean).join(" ")],
    ["Policy", (x) => x.policy || ""],
  ]);
}

/** The queue listing, one page of the server's, and a form to declare one. */
export function queues() {
  const link = (x) => h("a", { href: `#/queue/${seg(x.vhost)}/${seg(x.name)}` }, x.name);
  const stats = (x, k) => fmtRate(((x.message_stats || {})[`${k}_details`] || {}).rate);
  const view = pagedListing("Queues", "queue", "/api/queues", "queues", [
    ["Vhost", (x) => x.vhost],
    ["Name", link],
    ["Type", (x) => x.type],
    ["Policy", (x) => x.policy || ""],
    ["State", (x) => x.state],
    ["Ready", (x) => fmtCount(x.messages_ready)],
    ["Unacked", (x) => fmtCount(x.messages_unacknowledged)],
    ["Total", (x) => fmtCount(x.messages)],
    ["Consumers", (x) => x.consumers],
    ["In", (x) => stats(x, "publish")],
    ["Out", (x) => stats(x, "deliver_get")],
  ]);
  const declare = form(
    "declare-queue",
    [
      field("Vhost", "vhost", { value: "/", size: 6 }),
      field("Name", "name", { required: true }),
      select("Type", "type", ["classic", "quorum", "stream"]),
      select("Durable", "durable", ["true", "false"]),
    ],
    "Add queue",
    async (v) => {
      const args = v.type === "classic" ? {} : { "x-queue-type": v.type };
      await api("PUT", `/api/queues/${seg(v.vhost)}/${seg(v.name)}`, {
        durable: v.type !== "classic" || v.durable === "true",
        auto_delete: false,
        arguments: args,
      });
      await view.refresh();
      return `Queue ${v.name} declared.`;
    },
  );
  view.el.append(h("h3", "Add a queue"), declare);
  return view;
}

/** A queue's page: figures and rates, consumers, bindings; get, publish, purge, delete. */
export function queue({ args, go }) {
  const [vhost, name] = args;
  const path = `/api/queues/${seg(vhost)}/${seg(name)}`;
  const info = h("div.totals#queue-info");
  const chartEl = h("div.chart#queue-rates-chart");
  const consumersEl = h("div#queue-consumers");
  const bindingsEl = h("div#queue-bindings");
  const messagesEl = h("div#got-messages");
  let chart = null;
  const getForm = form(
    "get-messages",
    [field("Messages", "count", { value: "1", size: 3 }), select("Ack mode", "ackmode", ["ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false"])],
    "Get messages",
    async (v) => {
      const got = await api("POST", `${path}/get`, { count: Number(v.count), ackmode: v.ackmode, encoding: "auto", truncate: 50000 });
      messagesEl.replaceChildren(
        ...got.map((m, i) =>
          h("div.message", h("div.meta", `Message ${i + 1} · exchange "${m.exchange}" · routing key "${m.routing_key}" · redelivered ${m.redelivered} · ${m.message_count} left`), h("pre.payload", m.payload)),
        ),
      );
      return got.length ? `${got.length} message(s).` : "Queue is empty.";
    },
  );
  const publishForm = form(
    "publish-message",
    [field("Payload", "payload", { size: 30, value: "" }), select("Delivery mode", "delivery_mode", ["1", "2"])],
    "Publish message",
    async (v) => {
      const r = await api("POST", `/api/exchanges/${seg(vhost)}/amq.default/publish`, {
        properties: { delivery_mode: Number(v.delivery_mode) },
        routing_key: name,
        payload: v.payload,
        payload_encoding: "string",
      });
      return r.routed ? "Message published." : "Message published, but not routed.";
    },
  );
  const purge = h("button.danger#purge", { onclick: async () => { if (confirm(`Purge ${name}?`)) { await api("DELETE", `${path}/contents`); await page.refresh(); } } }, "Purge messages");
  const del = h("button.danger#delete-queue", { onclick: async () => { if (confirm(`Delete ${name}?`)) { await api("DELETE", path); go("#/queues"); } } }, "Delete queue");
  const el = h(
    "section",
    h("h2", `Queue ${name}`, h("span.sub", ` in vhost ${vhost}`)),
    info,
    chartEl,
    h("h3", "Consumers"), consumersEl,
    h("h3", "Bindings"), bindingsEl,
    h("h3", "Publish message"), publishForm,
    h("h3", "Get messages"), getForm, messagesEl,
    h("h3", "Purge and delete"), h("div", purge, " ", del),
  );
  const page = {
    el,
    refresh: async () => {
      const [q, consumers, bindings] = await Promise.all([get(path), get(`/api/consumers/${seg(vhost)}`), get(`${path}/bindings`)]);
      const ms = q.message_stats || {};
      const rate = (k) => (ms[`${k}_details`] || {}).rate || 0;
      const policyDef = q.effective_policy_definition && Object.keys(q.effective_policy_definition).length ? JSON.stringify(q.effective_policy_definition) : "";
      info.replaceChildren(
        ...[
          ["Type", q.type],
          ["State", q.state],
          ["Node", q.node],
          // A quorum queue's or a stream's replicas, as RabbitMQ's queue page shows them.
          ...(q.members ? [["Leader", q.leader], ["Online", (q.online || []).join(", ")], ["Members", q.members.join(", ")]] : []),
          // A stream's log: where retention has moved its head, and what is on disk.
          ...(q.type === "stream" && q.segments !== undefined
            ? [["First offset", fmtCount(q.first_offset)], ["Committed offset", fmtCount(q.committed_offset)], ["Segments", fmtCount(q.segments)]]
            : []),
          ["Durable", String(q.durable)],
          ["Policy", q.policy || ""],
          ["Effective policy", policyDef],
          ["Arguments", JSON.stringify(q.arguments || {})],
          ["Ready", fmtCount(q.messages_ready)],
          ["Unacked", fmtCount(q.messages_unacknowledged)],
          ["Total", fmtCount(q.messages)],
          ["Consumers", q.consumers],
          ["Publish", fmtRate(rate("publish"))],
          ["Deliver/get", fmtRate(rate("deliver_get"))],
          ["Ack", fmtRate(rate("ack"))],
        ].map(([k, v]) => h("div.total", { "data-key": k }, h("span.k", k), h("span.v", v))),
      );
      chart = chart || new RollingChart(chartEl, "Rates (/s)", ["publish", "deliver/get", "ack"]);
      chart.push(now(), [rate("publish"), rate("deliver_get"), rate("ack")]);
      consumersEl.replaceChildren(
        table(
          [["Channel", (c) => (c.channel_details || {}).name || ""], ["Tag", (c) => c.consumer_tag], ["Ack required", (c) => String(c.ack_required)], ["Prefetch", (c) => c.prefetch_count]],
          consumers.filter((c) => (c.queue || {}).name === name),
        ),
      );
      bindingsEl.replaceChildren(table([["From", (b) => b.source || "(AMQP default)"], ["Routing key", (b) => b.routing_key], ["Arguments", (b) => JSON.stringify(b.arguments || {})]], bindings));
    },
    destroy: () => chart && chart.destroy(),
  };
  return page;
}
