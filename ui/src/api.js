// The management HTTP API as the UI calls it: basic auth with the broker's users, kept in
// sessionStorage for the tab's life (RabbitMQ's UI does the same), RabbitMQ's JSON bodies.

const KEY = "warren-auth";

export function login(user, password) {
  sessionStorage.setItem(KEY, btoa(unescape(encodeURIComponent(`${user}:${password}`))));
}

export function logout() {
  sessionStorage.removeItem(KEY);
}

export function loggedIn() {
  return sessionStorage.getItem(KEY) !== null;
}

/** A path segment: `/` (the default vhost) and every reserved character escaped. */
export function seg(s) {
  return encodeURIComponent(s);
}

export class ApiError extends Error {
  constructor(status, reason) {
    super(reason);
    this.status = status;
  }
}

/** Calls the API; resolves with the parsed body (null when empty), rejects with ApiError. */
export async function api(method, path, body) {
  const headers = { authorization: `Basic ${sessionStorage.getItem(KEY) || ""}` };
  if (body !== undefined) headers["content-type"] = "application/json";
  // credentials "omit": the Authorization header is ours; a 401's WWW-Authenticate must not
  // make the browser prompt for (and then cache) a login of its own.
  const r = await fetch(path, {
    method,
    credentials: "omit",
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (!r.ok) {
    const reason = (json && (json.reason || json.error)) || `${r.status} ${r.statusText}`;
    throw new ApiError(r.status, reason);
  }
  return json;
}

export const get = (path) => api("GET", path);
