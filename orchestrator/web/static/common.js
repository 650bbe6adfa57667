// Shared by both pages: the JSON API client (the admin token from localStorage goes only with admin
// calls, see api()), the token panel,
// the error banner, number/time formatting (ETA and cost come computed from the server: eta_s, cost_usd),
// a DOM builder that never parses HTML, and a poller that pauses while the tab is hidden.

export const ROOT = document.body.dataset.root || "";
export const API = ROOT + "/api/v1";
const TOKEN_KEY = "spotswarm.adminToken";
export const TERMINAL_STATES = new Set(["stopped", "completed", "failed"]);
export const LIVE_WORKER_STATES = new Set(["launching", "running"]);

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function getToken() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

function detailOf(body, fallback) {
  if (!body || body.detail === undefined) return fallback;
  if (typeof body.detail === "string") return body.detail;
  if (Array.isArray(body.detail) && body.detail.length) {
    const first = body.detail[0];
    const where = (first.loc || []).filter((p) => p !== "body").join(".");
    return where ? `${where}: ${first.msg}` : String(first.msg);
  }
  return fallback;
}

// Set once the orchestrator refused an anonymous read (it runs with --no-public-reads): from then on
// reads carry the token too, since none works without it.
let readsNeedToken = false;

async function send(path, method, body, token) {
  const headers = { Accept: "application/json" };
  if (token) headers.Authorization = "Bearer " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  try {
    return await fetch(API + path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store",
    });
  } catch (err) {
    throw new ApiError(0, "orchestrator unreachable");
  }
}

/**
 * Call the API; resolves to the JSON body, rejects with ApiError (status 0: no answer).
 * The admin token is sent only when the call needs it: admin calls ({ admin: true }: scale, stop,
 * resume, the full view of a run) and, on an orchestrator without public reads, reads (learnt from the
 * first 401, then retried with the token). Polled reads go without it, so it crosses the network only
 * when the user acts.
 */
export async function api(path, { method = "GET", body, admin = false } = {}) {
  const token = getToken();
  const withToken = Boolean(token) && (admin || readsNeedToken);
  let response = await send(path, method, body, withToken ? token : "");
  if (response.status === 401 && token && !withToken && method === "GET") {
    readsNeedToken = true;
    response = await send(path, method, body, token);
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (err) { data = null; }
  if (!response.ok) {
    let message = `${response.status} ${detailOf(data, response.statusText)}`;
    if ((response.status === 401 || response.status === 403) && !token) message += " (set the admin token)";
    throw new ApiError(response.status, message);
  }
  return data;
}

// -- DOM -----------------------------------------------------------------------------------------------

/** Build an element; children are nodes or strings (always text, never HTML). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function setText(id, text) {
  const node = document.getElementById(id);
  if (node && node.textContent !== text) node.textContent = text;
}

export function showError(message) {
  const node = document.getElementById("error");
  node.textContent = message || "";
  node.hidden = !message;
}

export function setupTokenPanel(onChange) {
  const panel = document.getElementById("token-panel");
  const input = document.getElementById("token-input");
  const button = document.getElementById("token-button");
  const label = () => { button.textContent = getToken() ? "admin token ✓" : "admin token"; };
  label();
  button.addEventListener("click", () => { panel.hidden = !panel.hidden; if (!panel.hidden) input.focus(); });
  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = input.value.trim();
    if (value) localStorage.setItem(TOKEN_KEY, value);
    input.value = "";
    panel.hidden = true;
    label();
    if (onChange) onChange();
  });
  document.getElementById("token-forget").addEventListener("click", () => {
    localStorage.removeItem(TOKEN_KEY);
    input.value = "";
    label();
    if (onChange) onChange();
  });
  return { open() { panel.hidden = false; input.focus(); } };
}

// -- formatting ----------------------------------------------------------------------------------------

export function fmtNumber(value, digits = 4) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "-";
  return Number(value.toPrecision(digits)).toString();
}

export function fmtInt(value) {
  return value === null || value === undefined ? "-" : Math.round(value).toLocaleString("en-US");
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds) || seconds < 0) return "-";
  let s = Math.round(seconds);
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d) return `${d}d${h}h`;
  if (h) return `${h}h${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m${String(s).padStart(2, "0")}s`;
  return `${s}s`;
}

export function fmtBytes(size) {
  if (size === null || size === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = size;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

export function fmtUsd(value) {
  return value === null || value === undefined ? "-" : "$" + value.toFixed(2);
}

export function parseTime(text) {
  if (!text) return null;
  const hasZone = /[zZ]|[+-]\d\d:?\d\d$/.test(text);
  const ms = Date.parse(hasZone ? text : text + "Z");
  return Number.isNaN(ms) ? null : ms;
}

export function ageSeconds(text, nowMs = Date.now()) {
  const ms = parseTime(text);
  return ms === null ? null : Math.max(0, (nowMs - ms) / 1000);
}

// -- derived numbers -----------------------------------------------------------------------------------

export function swarmEpoch(run) {
  return Math.max(run.reported.swarm_epoch || 0, (run.swarm && run.swarm.epoch) || 0);
}

// -- polling -------------------------------------------------------------------------------------------

/**
 * Call task() every intervalMs (never overlapping; paused while the tab is hidden).
 * Returns { now() } to run it at once (e.g. after a button press).
 */
export function poll(task, intervalMs) {
  let timer = null;
  let running = false;
  const run = async () => {
    clearTimeout(timer);
    if (running) return;
    running = true;
    try { await task(); } finally {
      running = false;
      if (!document.hidden) timer = setTimeout(run, intervalMs);
    }
  };
  document.addEventListener("visibilitychange", () => { if (!document.hidden) run(); });
  run();
  return { now: run };
}

/** Tracks when data last arrived; shows "updated Ns ago" or the last error. */
export function freshness() {
  let lastOk = null;
  const render = () => {
    setText("updated", lastOk === null ? "loading…" : `updated ${fmtDuration((Date.now() - lastOk) / 1000)} ago`);
  };
  setInterval(render, 1000);
  return {
    ok() { lastOk = Date.now(); showError(""); render(); },
    failed(err) { showError(err instanceof ApiError ? err.message : String(err)); render(); },
  };
}
