// The runs overview: one row per run, refreshed every few seconds from GET /api/v1/runs.
// Cost needs each run's workers; those are fetched less often (cost moves slowly).

import {
  ROOT, api, ageSeconds, el, etaSeconds, fmtDuration, fmtNumber, fmtUsd, freshness, poll, runCost,
  setupTokenPanel, swarmEpoch,
} from "./common.js";

const RUNS_EVERY_MS = 3000;
const COST_EVERY_MS = 15000;
const PAGE_SIZE = 200;

const costs = new Map(); // run name -> cost in USD or null
let lastRuns = [];
let totalRuns = 0;
const status = freshness();

function row(run) {
  const live = `${run.workers.live}/${run.workers.desired}`;
  const cost = costs.has(run.name) ? fmtUsd(costs.get(run.name)) : "-";
  return el("tr", { "data-run": run.name },
    el("td", {}, el("a", { href: `${ROOT}/runs/${encodeURIComponent(run.name)}` }, run.name)),
    el("td", {}, el("span", { class: `state state-${run.state}`, title: run.state_reason || "" }, run.state)),
    el("td", { class: "num workers" }, live),
    el("td", { class: "num" }, String(swarmEpoch(run))),
    el("td", { class: "num" }, fmtNumber(run.reported.samples_per_s, 3)),
    el("td", { class: "num" }, fmtNumber(run.reported.loss)),
    el("td", { class: "num" }, fmtDuration(etaSeconds(run))),
    el("td", { class: "num" }, cost),
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

async function refreshCosts() {
  await Promise.all(lastRuns.map(async (run) => {
    try {
      const page = await api(`/runs/${encodeURIComponent(run.name)}/workers?limit=500`);
      costs.set(run.name, runCost(page.items));
    } catch (err) {
      costs.delete(run.name); // shown as "-"; the runs poll reports connection trouble
    }
  }));
  render();
}

setupTokenPanel(() => runs.now());
const runs = poll(refreshRuns, RUNS_EVERY_MS);
setTimeout(() => poll(refreshCosts, COST_EVERY_MS), 500);
