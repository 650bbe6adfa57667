// One run's page. Polls the JSON API without the admin token (run, workers and events every 2 s; the
// progress series, checkpoints and peers less often), redraws the charts and tables in place, and sends
// scale/stop/resume, downloads and the one read of the run's full spec with the admin token the user
// pasted (localStorage; never part of the page).

import { drawLineChart } from "./charts.js";
import {
  API, LIVE_WORKER_STATES, ROOT, TERMINAL_STATES, ApiError, ageSeconds, api, el, fmtBytes, fmtDuration,
  fmtInt, fmtNumber, fmtUsd, freshness, getToken, parseTime, poll, setText, setupTokenPanel, swarmEpoch,
} from "./common.js";

const NAME = document.body.dataset.run;
const RUN_PATH = `/runs/${encodeURIComponent(NAME)}`;
const FAST_MS = 2000;
const PROGRESS_MS = 5000;
const SLOW_MS = 10000;
const MAX_EVENTS_SHOWN = 500;
const MAX_WORKER_HISTORY = 2000; // per-worker points kept in memory (since the page opened)

const LOSS_NAMES = new Set(["train_loss", "loss", "train/loss"]); // the loss column and chart show these

const state = { run: null, workers: [], progress: null, eventsAfter: 0, history: new Map() };
const status = freshness();
const token = setupTokenPanel(() => { refreshAll(); refreshSpec(); });

// -- run, tiles and controls ---------------------------------------------------------------------------

function renderRun(run) {
  const badge = document.getElementById("run-state");
  badge.textContent = run.state;
  badge.className = `state state-${run.state}`;
  setText("state-reason", run.state_reason || "");
  setText("t-workers", `${run.workers.live} / ${run.workers.desired}`);
  // in DiLoCo mode a swarm epoch is one averaging round
  setText("t-epoch-label", run.sync === "diloco" ? "rounds" : "swarm epoch");
  setText("progress-unit", run.sync === "diloco" ? "rounds" : "swarm epoch");
  setText("t-epoch", String(swarmEpoch(run)));
  setText("t-sync", `sync: ${run.sync || "gradients"}`);
  setText("t-speed", fmtNumber(run.reported.samples_per_s, 3));
  setText("t-loss", fmtNumber(run.reported.loss));
  const shown = chosenMetric() || validationMetric(Object.keys(run.reported.metrics || {}));
  setText("t-metric-label", shown || "validation");
  setText("t-metric", shown ? fmtNumber((run.reported.metrics || {})[shown]) : "-");
  setText("t-samples", fmtInt(run.reported.samples_total));
  renderAveraging(run.averaging);
  setText("t-eta", fmtDuration(run.eta_s));
  setText("t-cost", fmtUsd(run.cost_usd));
  setText("t-age", fmtDuration(ageSeconds(run.created_at)));
  const input = document.getElementById("scale-input");
  input.min = String(run.workers.min);
  input.max = String(run.workers.max);
  if (document.activeElement !== input) input.value = String(run.workers.desired);
  const terminal = TERMINAL_STATES.has(run.state);
  document.getElementById("scale-button").disabled = terminal || run.state === "stopping";
  document.getElementById("stop-button").hidden = terminal;
  document.getElementById("stop-button").disabled = run.state === "stopping";
  document.getElementById("resume-button").hidden = !(run.state === "stopped" || run.state === "failed");
}

/** The averaged fraction over the recent window, its mean group size, the share of time waiting on
 * averaging with G (compute per round / the round's cost), and the warning when one is up. */
function renderAveraging(window) {
  const epochs = window ? window.epochs : 0;
  setText("t-averaged", epochs ? `${Math.round(100 * (window.averaged_fraction || 0))}%` : "-");
  const group = window && window.mean_group_size ? `, groups of ${fmtNumber(window.mean_group_size, 2)}` : "";
  const batch = window && window.batch_ratio ? `, batch ${fmtNumber(window.batch_ratio, 2)}x` : "";
  setText("t-averaged-detail", epochs ? `of ${fmtInt(epochs)} worker-epochs${group}${batch}` : "");
  const share = window ? window.waiting_share : null;
  setText("t-waiting", share === null || share === undefined ? "-" : `${Math.round(100 * share)}%`);
  const g = window && window.g !== null && window.g !== undefined ? `G ${fmtNumber(window.g, 2)}` : "";
  setText("t-waiting-detail", share === null || share === undefined ? "" : g || "G unbounded (no waiting)");
  const warning = document.getElementById("averaging-warning");
  warning.hidden = !(window && window.warning);
  warning.textContent = window && window.warning ? `Averaging: ${window.warning}` : "";
}

let seenCheckpoint;

async function refreshRun() {
  try {
    state.run = await api(RUN_PATH);
    renderRun(state.run);
    const latest = state.run.latest_checkpoint ? state.run.latest_checkpoint.epoch : null;
    if (seenCheckpoint !== undefined && latest !== seenCheckpoint) checkpointsPoll.now(); // a new one: list it
    seenCheckpoint = latest;
    status.ok();
  } catch (err) {
    status.failed(err);
  }
}

function say(message) {
  setText("control-message", message);
}

async function act(path, body, done) {
  if (!getToken()) {
    say("paste the admin token first");
    token.open();
    return;
  }
  try {
    const run = await api(path, { method: "POST", body, admin: true });
    state.run = run;
    renderRun(run);
    say(done(run));
  } catch (err) {
    say(err instanceof ApiError ? err.message : String(err));
    if (err.status === 401 || err.status === 403) token.open();
  }
}

document.getElementById("scale-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const desired = Number(document.getElementById("scale-input").value);
  act(`${RUN_PATH}/scale`, { desired_workers: desired }, (run) => `desired workers set to ${run.workers.desired}`);
  document.getElementById("scale-input").blur();
});
document.getElementById("stop-button").addEventListener("click", () => {
  if (!window.confirm(`Stop run ${NAME}? Its workers are told to leave; checkpoints are kept.`)) return;
  act(`${RUN_PATH}/stop`, { reason: "stopped from the status page" }, (run) => `run is ${run.state}`);
});
document.getElementById("resume-button").addEventListener("click", () => {
  act(`${RUN_PATH}/resume`, undefined, (run) => `run is ${run.state}`);
});

// -- the spec: its free-form values (args, options) only in the admin view ----------------------------

/** Read once (and again when the token changes), with the token when one is set: the spec never polls. */
async function refreshSpec() {
  try {
    const run = await api(RUN_PATH, { admin: true });
    setText("spec", JSON.stringify(run.spec, null, 2));
    setText("spec-note", run.redacted
      ? "module_args, datamodule_args, strategy_options, launcher_options and the args of trainer callbacks and loggers are shown to the admin token only"
      : "");
  } catch (err) {
    setText("spec-note", err instanceof ApiError ? err.message : String(err));
  }
}

// -- workers -------------------------------------------------------------------------------------------

function ended(worker) {
  if (LIVE_WORKER_STATES.has(worker.state)) return worker.retire_requested_at ? "retiring" : "";
  let why = (worker.exit_reason || worker.state_reason || "").replace(/\s+/g, " ").trim();
  if (why.startsWith(worker.state + ":")) why = why.slice(worker.state.length + 1).trim();
  return why ? `${worker.state}: ${why.slice(0, 80)}` : worker.state;
}

function metricsText(metrics) {
  return Object.entries(metrics || {}).filter(([name]) => !LOSS_NAMES.has(name))
    .map(([name, value]) => `${name}=${fmtNumber(value)}`).join(" ");
}

function workerRow(w) {
  const heartbeat = ageSeconds(w.last_heartbeat_at);
  return el("tr", { "data-worker": w.id, "data-state": w.state },
    el("td", { title: w.checkpointer ? "uploads the run's checkpoints" : null }, w.id + (w.checkpointer ? " ★" : "")),
    el("td", {}, el("span", { class: `state state-${w.state}` }, w.state)),
    el("td", { class: "mono" }, w.launcher_handle || "-"),
    el("td", {}, w.hostname || "-"),
    el("td", { class: "num" }, heartbeat === null ? "-" : `${fmtDuration(heartbeat)} ago`),
    el("td", { class: "num" }, fmtInt(w.samples)),
    el("td", { class: "num" }, fmtNumber(w.samples_per_s, 3)),
    el("td", { class: "num" }, fmtNumber(w.loss)),
    el("td", { class: "num averaged" }, w.averaged_fraction === null || w.averaged_fraction === undefined
      ? "-" : `${Math.round(100 * w.averaged_fraction)}%`),
    el("td", { class: "metrics mono" }, metricsText(w.metrics)),
    el("td", { class: "num" }, fmtUsd(w.cost_usd)),
    el("td", { class: "ended" }, ended(w)),
  );
}

function remember(workers) {
  for (const w of workers) {
    if (w.state !== "running" || !w.last_heartbeat_at) continue;
    const at = parseTime(w.last_heartbeat_at);
    const rows = state.history.get(w.id) || [];
    if (rows.length && rows[rows.length - 1].at === at) continue;
    rows.push({ at, loss: w.loss, speed: w.samples_per_s });
    if (rows.length > MAX_WORKER_HISTORY) rows.splice(0, rows.length - MAX_WORKER_HISTORY);
    state.history.set(w.id, rows);
  }
}

async function refreshWorkers() {
  try {
    const page = await api(`${RUN_PATH}/workers?limit=500`);
    state.workers = page.items;
    remember(page.items);
    const live = page.items.filter((w) => LIVE_WORKER_STATES.has(w.state)).length;
    setText("workers-count", `${live} live, ${page.total} in all`);
    document.querySelector("#workers tbody").replaceChildren(...page.items.map(workerRow));
    if (document.getElementById("per-worker").checked) drawCharts();
  } catch (err) {
    status.failed(err);
  }
}

// -- charts --------------------------------------------------------------------------------------------

/** The metric a validation chart shows by default: val_loss when reported, else the first val* name. */
function validationMetric(names) {
  const sorted = [...names].sort();
  return sorted.includes("val_loss") ? "val_loss" : sorted.find((name) => name.startsWith("val")) || sorted[0] || "";
}

function chosenMetric() {
  return document.getElementById("metric-select").value;
}

/** Offer every metric the progress series holds; keep the user's choice, else the validation metric. */
function updateMetricChoice(points) {
  const names = [...new Set(points.flatMap((p) => Object.keys(p.metrics || {})))].sort();
  const select = document.getElementById("metric-select");
  const current = [...select.options].map((o) => o.value).filter(Boolean);
  if (names.join("\n") === current.join("\n")) return;
  const keep = names.includes(select.value) ? select.value : validationMetric(names);
  select.replaceChildren(...(names.length ? names : [""]).map((name) =>
    el("option", { value: name }, name || "none reported yet")));
  select.value = keep;
}

const LOCAL_OUTCOMES = ["alone", "no_group", "timeout", "failed"];

/** Spans between progress points in which most worker-epochs were applied locally (not averaged). */
function localSpans(points, times) {
  const spans = [];
  for (let i = 1; i < points.length; i++) {
    const now = points[i].averaging, before = points[i - 1].averaging;
    if (!now || !before) continue;
    const delta = (key) => Math.max(0, (now[key] || 0) - (before[key] || 0));
    const local = LOCAL_OUTCOMES.reduce((sum, key) => sum + delta(key), 0);
    const averaged = delta("averaged");
    if (local > averaged) spans.push([times[i - 1], times[i], `${local} of ${local + averaged} worker-epochs local`]);
  }
  return spans;
}

function drawCharts() {
  const points = state.progress ? state.progress.points : [];
  const times = points.map((p) => parseTime(p.at));
  const loss = [{ name: "swarm", main: true, points: points.map((p, i) => [times[i], p.loss]) }];
  const speed = [{ name: "swarm", main: true, points: points.map((p, i) => [times[i], p.samples_per_s]) }];
  if (document.getElementById("per-worker").checked) {
    for (const [id, rows] of state.history) {
      loss.push({ name: `w${id}`, points: rows.map((r) => [r.at, r.loss]) });
      speed.push({ name: `w${id}`, points: rows.map((r) => [r.at, r.speed]) });
    }
  }
  updateMetricChoice(points);
  const name = chosenMetric();
  const metric = [{ name: name || "metric", main: true,
    points: points.map((p, i) => [times[i], (p.metrics || {})[name] ?? null]) }];
  const xRange = times.length ? [times[0], times[times.length - 1]] : null; // one time axis for all
  const events = churnEvents(state.progress ? state.progress.marks : []);
  const epochs = [{ name: "epoch", main: true,
    points: points.map((p, i) => [times[i], Math.max(p.swarm_epoch, p.dht_epoch || 0)]) }];
  drawLineChart(document.getElementById("progress-chart"), epochs,
    { xRange, zeroBased: true, empty: "no progress yet", events });
  const workers = [
    { name: "live", main: true, points: points.map((p, i) => [times[i], p.live_workers]) },
    { name: "desired", color: "#2563eb", points: points.map((p, i) => [times[i], p.desired_workers]) },
  ];
  drawLineChart(document.getElementById("workers-chart"), workers,
    { xRange, zeroBased: true, integer: true, empty: "no workers yet", events });
  drawLineChart(document.getElementById("loss-chart"), loss,
    { xRange, empty: "no loss reported yet", marks: localSpans(points, times) });
  drawLineChart(document.getElementById("metric-chart"), metric,
    { xRange, empty: name ? `no ${name} yet` : "no metric reported yet (report_metrics)" });
  drawLineChart(document.getElementById("speed-chart"), speed, { xRange, zeroBased: true, empty: "no throughput yet" });
  if (state.progress) {
    renderGoodput(state.progress.goodput);
    setText("points-note", `${points.length} of ${state.progress.stored_points} stored points`);
  }
}

/** Notice and loss marks as chart events. */
function churnEvents(marks) {
  return (marks || []).map((m) => ({
    at: parseTime(m.at), kind: m.kind,
    title: `${m.kind === "notice" ? "left after a spot notice" : "lost"}: worker ${m.worker_id ?? "?"} at ` +
      `${new Date(parseTime(m.at)).toLocaleTimeString()} (${m.reason})`,
  }));
}

/** Goodput over the last hour as a percentage, and the steady rate it is measured against. */
function renderGoodput(goodput) {
  setText("t-goodput", goodput ? `${Math.round(100 * goodput.value)}%` : "-");
  setText("t-goodput-detail", goodput
    ? `vs ${fmtNumber(goodput.steady_samples_per_worker_s, 3)} samples/s per worker`
    : "needs two epochs at a steady worker count");
}

async function refreshProgress() {
  const width = document.getElementById("loss-chart").clientWidth || 600;
  const maxPoints = Math.min(1000, Math.max(100, Math.round(width)));
  try {
    state.progress = await api(`${RUN_PATH}/progress?max_points=${maxPoints}`);
    drawCharts();
  } catch (err) {
    status.failed(err);
  }
}

document.getElementById("metric-select").addEventListener("change", () => {
  drawCharts();
  if (state.run) renderRun(state.run);
});
document.getElementById("per-worker").addEventListener("change", (event) => {
  document.getElementById("per-worker-note").hidden = !event.target.checked;
  drawCharts();
});
let resizeTimer = null;
window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(drawCharts, 150); });

// -- events --------------------------------------------------------------------------------------------

async function refreshEvents() {
  try {
    for (;;) { // drain every page newer than the cursor
      const page = await api(`${RUN_PATH}/events?after_id=${state.eventsAfter}&limit=500`);
      const list = document.getElementById("events");
      for (const e of page.items) {
        const who = e.worker_id ? ` [worker ${e.worker_id}]` : "";
        list.prepend(el("li", { "data-kind": e.kind },
          el("time", { datetime: e.at }, new Date(parseTime(e.at)).toLocaleTimeString()),
          el("span", { class: "kind" }, e.kind), `${who} ${e.message}`));
      }
      while (list.children.length > MAX_EVENTS_SHOWN) list.lastElementChild.remove();
      state.eventsAfter = page.next_after_id;
      if (!page.items.length) break;
    }
  } catch (err) {
    status.failed(err);
  }
}

// -- checkpoints and peers -----------------------------------------------------------------------------

function downloadUrl(path) {
  return path.startsWith("/api/") ? ROOT + path : API + path;
}

/** Checkpoint downloads need a token (the API's rule), which a plain link cannot send: fetch, then save. */
async function downloadWithToken(event, url, filename) {
  event.preventDefault();
  if (!getToken()) {
    say("downloads need the admin token: paste it first");
    token.open();
    return;
  }
  say(`downloading ${filename}…`);
  try {
    const response = await fetch(url, { headers: { Authorization: "Bearer " + getToken() } });
    if (!response.ok) throw new ApiError(response.status, `download failed: ${response.status}`);
    const link = el("a", { href: URL.createObjectURL(await response.blob()), download: filename });
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 60e3);
    say(`downloaded ${filename}`);
  } catch (err) {
    say(err instanceof ApiError ? err.message : "download failed: orchestrator unreachable");
  }
}

async function refreshCheckpoints() {
  try {
    const page = await api(`${RUN_PATH}/checkpoints`);
    const rows = page.items.map((c) => {
      const url = downloadUrl(c.download_path);
      const filename = `${NAME}-epoch-${c.epoch}.ckpt`;
      const link = el("a", { href: url, download: filename }, "download");
      link.addEventListener("click", (event) => downloadWithToken(event, url, filename));
      return el("tr", { "data-epoch": c.epoch },
        el("td", { class: "num" }, String(c.epoch)), el("td", { class: "num" }, fmtBytes(c.size_bytes)),
        el("td", {}, new Date(parseTime(c.created_at)).toLocaleString()), el("td", {}, link));
    });
    const body = document.querySelector("#checkpoints tbody");
    body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 4, class: "muted" }, "none yet"))]));
  } catch (err) {
    status.failed(err);
  }
}

async function refreshPeers() {
  try {
    const page = await api(`${RUN_PATH}/peers`);
    setText("peers", page.initial_peers.length ? page.initial_peers.join("\n") : "(none known yet)");
    document.getElementById("copy-peers").dataset.value = page.initial_peers.join(",");
  } catch (err) {
    status.failed(err);
  }
}

document.getElementById("copy-peers").addEventListener("click", async (event) => {
  const value = event.target.dataset.value || "";
  try {
    await navigator.clipboard.writeText(value);
  } catch (err) { // no clipboard API (plain http on a remote host): select the text for Ctrl-C
    const range = document.createRange();
    range.selectNodeContents(document.getElementById("peers"));
    window.getSelection().removeAllRanges();
    window.getSelection().addRange(range);
    document.execCommand("copy");
  }
  event.target.textContent = "copied";
  setTimeout(() => { event.target.textContent = "copy"; }, 1500);
});

// -- start ---------------------------------------------------------------------------------------------

const checkpointsPoll = poll(refreshCheckpoints, SLOW_MS);
const polls = [
  poll(refreshRun, FAST_MS), poll(refreshWorkers, FAST_MS), poll(refreshEvents, FAST_MS),
  poll(refreshProgress, PROGRESS_MS), checkpointsPoll, poll(refreshPeers, SLOW_MS),
];

refreshSpec();

function refreshAll() {
  for (const p of polls) p.now();
}
