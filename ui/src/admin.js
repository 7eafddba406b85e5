// Administration: users, vhosts, permissions, policies, and the cluster's nodes.

import { api, get, seg } from "./api.js";
import { h, table, form, field, select, fmtBytes, fmtCount, fmtUptime } from "./dom.js";

function parseJson(text, what) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${what} is not JSON: ${e.message}`);
  }
}

export function admin() {
  const users = h("div#users");
  const vhosts = h("div#vhosts");
  const permissions = h("div#permissions");
  const policies = h("div#policies");
  const nodes = h("div#nodes");
  const remove = (path, label) =>
    h("button.danger", { onclick: async () => { if (confirm(`Delete ${label}?`)) { await api("DELETE", path); await page.refresh(); } } }, "Delete");
  const el = h(
    "section",
    h("h2", "Admin"),
    h("h3", "Users"),
    users,
    form(
      "add-user",
      [field("Username", "name", { required: true }), field("Password", "password", { type: "password" }), field("Tags", "tags", { placeholder: "administrator,management" })],
      "Add user",
      async (v) => {
        await api("PUT", `/api/users/${seg(v.name)}`, { password: v.password, tags: v.tags });
        await page.refresh();
        return `User ${v.name} added.`;
      },
    ),
    h("h3", "Virtual hosts"),
    vhosts,
    form("add-vhost", [field("Name", "name", { required: true })], "Add vhost", async (v) => {
      await api("PUT", `/api/vhosts/${seg(v.name)}`, {});
      await page.refresh();
      return `Vhost ${v.name} added.`;
    }),
    h("h3", "Permissions"),
    permissions,
    form(
      "set-permissions",
      [field("Vhost", "vhost", { value: "/", size: 6 }), field("User", "user", { required: true }), field("Configure", "configure", { value: ".*", size: 6 }), field("Write", "write", { value: ".*", size: 6 }), field("Read", "read", { value: ".*", size: 6 })],
      "Set permissions",
      async (v) => {
        await api("PUT", `/api/permissions/${seg(v.vhost)}/${seg(v.user)}`, { configure: v.configure, write: v.write, read: v.read });
        await page.refresh();
        return "Permissions set.";
      },
    ),
    h("h3", "Policies"),
    policies,
    form(
      "add-policy",
      [
        field("Vhost", "vhost", { value: "/", size: 6 }),
        field("Name", "name", { required: true }),
        field("Pattern", "pattern", { required: true, placeholder: "^orders\\." }),
        select("Apply to", "apply_to", ["queues", "exchanges", "all"]),
        field("Priority", "priority", { value: "0", size: 3 }),
        field("Definition", "definition", { required: true, size: 40, placeholder: '{"max-length": 1000}' }),
      ],
      "Add / update policy",
      async (v) => {
        await api("PUT", `/api/policies/${seg(v.vhost)}/${seg(v.name)}`, {
          pattern: v.pattern,
          "apply-to": v.apply_to,
          priority: Number(v.priority) || 0,
          definition: parseJson(v.definition, "The definition"),
        });
        await page.refresh();
        return `Policy ${v.name} set.`;
      },
    ),
    h("h3", "Nodes"),
    nodes,
  );
  const page = {
    el,
    refresh: async () => {
      const [u, v, p, pol, n] = await Promise.all([get("/api/users"), get("/api/vhosts"), get("/api/permissions"), get("/api/policies"), get("/api/nodes").catch(() => [])]);
      users.replaceChildren(table([["Name", (x) => x.name], ["Tags", (x) => [].concat(x.tags).join(", ")], ["", (x) => remove(`/api/users/${seg(x.name)}`, `user ${x.name}`)]], u, { id: "users-table" }));
      vhosts.replaceChildren(table([["Name", (x) => x.name], ["Messages", (x) => x.messages ?? ""], ["", (x) => remove(`/api/vhosts/${seg(x.name)}`, `vhost ${x.name}`)]], v, { id: "vhosts-table" }));
      permissions.replaceChildren(
        table([["User", (x) => x.user], ["Vhost", (x) => x.vhost], ["Configure", (x) => x.configure], ["Write", (x) => x.write], ["Read", (x) => x.read], ["", (x) => remove(`/api/permissions/${seg(x.vhost)}/${seg(x.user)}`, `${x.user}'s permissions in ${x.vhost}`)]], p, { id: "permissions-table" }),
      );
      policies.replaceChildren(
        table(
          [["Vhost", (x) => x.vhost], ["Name", (x) => x.name], ["Pattern", (x) => x.pattern], ["Apply to", (x) => x["apply-to"]], ["Priority", (x) => x.priority], ["Definition", (x) => JSON.stringify(x.definition)], ["", (x) => remove(`/api/policies/${seg(x.vhost)}/${seg(x.name)}`, `policy ${x.name}`)]],
          pol,
          { id: "policies-table" },
        ),
      );
      // A node that is down is listed with its name alone: its figures show empty, not "undefined".
      const known = (v, fmt) => (v === undefined || v === null ? "" : fmt(v));
      nodes.replaceChildren(
        table(
          [
            ["Name", (x) => x.name],
            ["Running", (x) => String(x.running)],
            ["Memory", (x) => known(x.mem_used, () => `${fmtBytes(x.mem_used)} of ${fmtBytes(x.mem_limit)}`)],
            ["Memory alarm", (x) => known(x.mem_alarm, String)],
            ["Disk free", (x) => known(x.disk_free, () => `${fmtBytes(x.disk_free)} (limit ${fmtBytes(x.disk_free_limit)})`)],
            ["Disk alarm", (x) => known(x.disk_free_alarm, String)],
            ["File descriptors", (x) => known(x.fd_used, () => `${fmtCount(x.fd_used)} of ${fmtCount(x.fd_total)}`)],
            ["Uptime", (x) => known(x.uptime, fmtUptime)],
          ],
          n,
          { id: "nodes-table" },
        ),
      );
    },
  };
  return page;
}
