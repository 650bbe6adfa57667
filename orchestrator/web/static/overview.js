// The runs overview: one row per run, refreshed every few seconds from GET /api/v1/runs (which carries
// each run's ETA and cost).

import {
  ROOT, api, ageSeconds, el, fmtDuration, fmtNumber, fmtUsd, freshness, poll, setupTokenPanel, swarmEpoch,
} from "./common.js";

const RUNS_EVERY_MS = 3000;
const PAGE_SIZE = 200;

let lastRuns = [];
let totalRuns = 0;
const status = freshness();

function row(run) {
  const live = `${run.workers.live}/${run.workers.desired}`;
  return el("tr", { "data-run": run.name },
    el("td", {}, el("a", { href: `${ROOT}/runs/${encodeURIComponent(run.name)}` }, run.name)),
    el("td", {}, el("span", { class: `state state-${run.state}`, title: run.state_reason || "" }, run.state)),
    el("td", { class: "num workers" }, live),
    el("td", { class: "num" }, String(swarmEpoch(run))),
    el("td", { class: "num" }, fmtNumber(run.reported.samples_per_s, 3)),
    el("td", { class: "num" }, fmtNumber(run.reported.loss)),
    el("td", { class: "num" }, fmtDuration(run.eta_s)),
    el("td", { class: "num" }, fmtUsd(run.cost_usd)),
    el("td", { class: "num" }, fmtDuration(ageSeconds(run.created_at))),
  );
}

function render() {
  document.querySelector("#runs tbody").replaceChildren(...lastRuns.map(row));
  document.getElementById("empty").hidden = lastRuns.length > 0;
  const more = document.getElementById("more");
  more.hidden = totalRuns <= lastRuns.length;
  more.textContent = `The ${lastRuns.length} newest of ${totalRuns} runs; \`spotswarm runs list --limit N\` lists more.`;
}

async function refreshRuns() {
  try {
    const page = await api(`/runs?limit=${PAGE_SIZE}`);
    lastRuns = page.items;
    totalRuns = page.total;
    render();
    status.ok();
  } catch (err) {
    status.failed(err);
  }
}

setupTokenPanel(() => runs.now());
const runs = poll(refreshRuns, RUNS_EVERY_MS);
