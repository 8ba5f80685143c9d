// The osmosis run viewer. Every value from a run is put on the page as text (textContent or
// SVG text nodes), never parsed as HTML, so a message holding markup shows as markup.
"use strict";

const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
let refreshTimer = null;
// Bumped on every navigation: a page still loading for an older route must not draw.
let generation = 0;

class Superseded extends Error {}

function current(gen) {
  if (gen !== generation) throw new Superseded();
}

function h(tag, attrs, ...children) {
  const svg = ["svg", "rect", "line", "polyline", "circle", "text", "g"].includes(tag);
  const el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const enc = encodeURIComponent;
const fmt = (v, digits = 3) => (v === null || v === undefined ? "–" : typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(digits)) : String(v));
const pct = (v) => (typeof v === "number" ? `${(v * 100).toFixed(1)}%` : "–");

async function api(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) {
    // The viewer's refusals say what is wrong in "detail" (a damaged run, a missing token).
    const body = await response.json().catch(() => ({}));
    throw new Error(typeof body.detail === "string" ? body.detail : `${response.status} ${path}`);
  }
  return response.json();
}

function setCrumbs(...parts) {
  crumbs.replaceChildren(...parts.flatMap((part, i) => (i ? [" / ", part] : [part])));
}

function show(...nodes) {
  main.replaceChildren(...nodes.filter((node) => node !== null));
}

function card(label, value) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value" }, value));
}

// ---- charts ------------------------------------------------------------------------------

function histogram(values, title) {
  const width = 320, height = 160, pad = 24, bins = 10;
  const svg = h("svg", { width, height, role: "img", "aria-label": title });
  if (!values.length) return h("div", { class: "chart" }, h("div", { class: "muted" }, `${title}: no rewards yet`));
  let lo = Math.min(...values), hi = Math.max(...values);
  if (lo === hi) { lo -= 0.5; hi += 0.5; }
  const counts = new Array(bins).fill(0);
  for (const v of values) counts[Math.min(bins - 1, Math.floor(((v - lo) / (hi - lo)) * bins))] += 1;
  const top = Math.max(...counts), barWidth = (width - 2 * pad) / bins;
  svg.append(h("line", { class: "axis", x1: pad, y1: height - pad, x2: width - pad, y2: height - pad }));
  counts.forEach((count, i) => {
    const barHeight = top ? ((height - 2 * pad) * count) / top : 0;
    svg.append(h("rect", { class: "bar", x: pad + i * barWidth + 1, y: height - pad - barHeight, width: barWidth - 2, height: barHeight },
      h("title", {}, `${count} in [${fmt(lo + (i * (hi - lo)) / bins)}, ${fmt(lo + ((i + 1) * (hi - lo)) / bins)})`)));
  });
  svg.append(h("text", { x: pad, y: height - 6 }, fmt(lo, 2)), h("text", { x: width - pad - 20, y: height - 6 }, fmt(hi, 2)));
  svg.append(h("text", { x: pad, y: 12 }, `${title} (${values.length})`));
  return h("div", { class: "chart" }, svg);
}

function passAtK(points) {
  // The right margin holds the widest value label ("100.0%") beside the last point; the top
  // one keeps a label at 100% clear of the title.
  const width = 320, height = 160, left = 24, right = 48, top = 32, bottom = 24;
  if (!points.length) return h("div", { class: "chart" }, h("div", { class: "muted" }, "pass@k: no runs yet"));
  const svg = h("svg", { width, height, role: "img", "aria-label": "pass@k" });
  const maxK = Math.max(...points.map((p) => p.k));
  const span = width - left - right;
  const x = (k) => left + (points.length === 1 ? span / 2 : (Math.log2(k) / Math.log2(maxK)) * span);
  const y = (v) => height - bottom - v * (height - top - bottom);
  svg.append(h("line", { class: "axis", x1: left, y1: height - bottom, x2: width - right, y2: height - bottom }));
  svg.append(h("polyline", { class: "line", points: points.map((p) => `${x(p.k)},${y(p.value)}`).join(" ") }));
  for (const p of points) {
    svg.append(h("circle", { class: "dot", cx: x(p.k), cy: y(p.value), r: 3 }, h("title", {}, `pass@${p.k} = ${pct(p.value)}`)));
    svg.append(h("text", { x: x(p.k), y: height - 8, "text-anchor": "middle" }, `k=${p.k}`));
    svg.append(h("text", { class: "value", x: x(p.k) + 5, y: y(p.value) - 5 }, pct(p.value)));
  }
  svg.append(h("text", { x: left, y: 12 }, "pass@k"));
  return h("div", { class: "chart" }, svg);
}

// ---- pages -------------------------------------------------------------------------------

async function runsPage(gen) {
  const runs = await api("/api/runs");
  current(gen);
  setCrumbs("runs");
  if (!runs.length) return show(h("h1", {}, "Runs"), h("p", { class: "muted" }, "No eval runs here yet."));
  const rows = runs.map((run) =>
    h("tr", { class: "clickable", "data-run": run.name, onclick: () => (location.hash = `#/run/${enc(run.name)}`) },
      h("td", {}, h("a", { href: `#/run/${enc(run.name)}` }, run.name)),
      h("td", {}, fmt(run.created_at)), h("td", {}, fmt(run.rollout)), h("td", {}, fmt(run.model)),
      h("td", { class: `status-${run.status}` }, run.status, run.problem ? h("div", { class: "problem" }, run.problem) : null),
      h("td", {}, fmt(run.total_samples)),
      h("td", {}, pct(run.pass_rate)), h("td", {}, fmt(run.mean_reward))));
  show(h("h1", {}, "Runs"), h("table", { id: "runs" },
    h("thead", {}, h("tr", {}, ["run", "created", "rollout", "model", "status", "samples", "pass rate", "mean reward"].map((c) => h("th", {}, c)))),
    h("tbody", {}, rows)));
}

const COLUMNS = [
  ["row_index", "row"], ["run_index", "run"], ["status", "status"], ["reward", "reward"],
  ["tokens", "tokens"], ["duration_ms", "duration (ms)"], ["error_type", "error type"],
];

function itemsTable(runName, items) {
  const state = { key: "row_index", asc: true, text: "", status: "" };
  const tbody = h("tbody");
  const head = h("tr");
  const render = () => {
    const text = state.text.toLowerCase();
    const shown = items
      .filter((it) => !state.status || it.status === state.status)
      .filter((it) => !text || COLUMNS.some(([key]) => String(it[key] ?? "").toLowerCase().includes(text)) || it.rollout_id.includes(text))
      .sort((a, b) => {
        const x = a[state.key], y = b[state.key];
        const order = x === y ? a.row_index - b.row_index || a.run_index - b.run_index : x === undefined || x === null ? 1 : y === undefined || y === null ? -1 : x < y ? -1 : 1;
        return state.asc ? order : -order;
      });
    tbody.replaceChildren(...shown.map((it) =>
      h("tr", { class: "clickable", "data-rollout": it.rollout_id, onclick: () => (location.hash = `#/run/${enc(runName)}/rollout/${enc(it.rollout_id)}`) },
        COLUMNS.map(([key]) => h("td", key === "status" ? { class: `status-${it.status}` } : {}, fmt(it[key], key === "reward" ? 3 : 1))))));
    head.replaceChildren(...COLUMNS.map(([key, label]) =>
      h("th", { class: key === state.key ? `sorted ${state.asc ? "asc" : ""}` : null, onclick: () => { state.asc = state.key === key ? !state.asc : true; state.key = key; render(); } }, label)));
  };
  const filter = h("input", { type: "search", placeholder: "filter…", id: "filter", oninput: (e) => { state.text = e.target.value; render(); } });
  const statuses = h("select", { id: "status-filter", onchange: (e) => { state.status = e.target.value; render(); } },
    h("option", { value: "" }, "all statuses"), ["success", "failed", "skipped"].map((s) => h("option", { value: s }, s)));
  render();
  return h("div", {}, h("div", { class: "filters" }, filter, statuses), h("table", { id: "items" }, h("thead", {}, head), tbody));
}

function livePanel(runName) {
  const panel = h("div", { id: "live" });
  const update = async () => {
    let previews = [];
    try { previews = await api(`/api/runs/${enc(runName)}/previews`); } catch (e) { return; }
    panel.replaceChildren(...(previews.length ? previews.map((p) => {
      const meta = p.extra.osmosis;
      const last = p.steps[p.steps.length - 1] || {};
      return h("div", { class: "live", "data-rollout": meta.rollout_id },
        h("a", { href: `#/run/${enc(runName)}/rollout/${enc(meta.rollout_id)}` }, meta.rollout_id), " ",
        h("span", { class: `pill status-${meta.status}` }, meta.status), " ",
        h("span", { class: "steps" }, `${p.steps.length} steps`), " · turn ", fmt(meta.turn), " · ",
        h("span", { class: "muted" }, String(last.message ?? "").slice(0, 160)));
    }) : [h("p", { class: "muted" }, "No rollout in flight.")]));
  };
  update();
  refreshTimer = setInterval(update, 1500);
  return panel;
}

// What the cards' numbers are (eval/metrics.py's summary), with this run's counts.
function definitions(summary, items) {
  if (!items.length) return null;
  const unrewarded = items.filter((it) => it.status === "failed" && typeof it.reward !== "number").length;
  return h("p", { class: "muted definitions", id: "definitions" },
    h("strong", {}, "pass rate"), ` = items whose reward is at least ${fmt(summary.pass_threshold)}, out of the ${fmt(summary.completed_samples)} not skipped; a failed item counts as not passed. `,
    h("strong", {}, "mean reward"), ` = average reward of the ${fmt(summary.graded)} items that have one; failed items without a reward (${unrewarded} here) are left out, not counted as 0.`);
}

async function runPage(runName, gen) {
  const run = await api(`/api/runs/${enc(runName)}`);
  current(gen);
  setCrumbs(h("a", { href: "#/" }, "runs"), runName);
  const title = h("h1", {}, run.name, " ", h("span", { class: `pill status-${run.status}` }, run.status));
  if (run.problem) return show(title, h("div", { class: "error", id: "problem" }, "This run cannot be read: ", run.problem));
  const items = await api(`/api/runs/${enc(runName)}/items`);
  current(gen);
  // The overview's summary comes from the journal, as the charts do, so both fill while the run goes on.
  const summary = run.summary || {};
  const rewards = items.map((it) => it.reward).filter((r) => typeof r === "number");
  const failed = items.filter((it) => it.status === "failed").length;
  show(
    title,
    h("p", { class: "muted" }, `${fmt((run.inputs.rollout || {}).name)} on ${fmt(run.inputs.model_path)} · n=${fmt(run.inputs.n)} · created ${fmt(run.created_at)}`),
    h("div", { class: "cards" },
      card("pass rate", pct(summary.pass_rate)), card("mean reward", fmt((summary.reward_stats || {}).mean)),
      card("items", String(items.length)), card("failed", String(failed)), card("tokens", fmt(summary.tokens_used))),
    definitions(summary, items),
    h("div", { class: "charts" }, histogram(rewards, "reward"), passAtK(run.pass_at_k || [])),
    h("h2", {}, "In flight"), livePanel(runName),
    h("h2", {}, "Work items"), itemsTable(runName, items));
}

function metricsLine(metrics) {
  if (!metrics) return null;
  const parts = [];
  if (metrics.prompt_tokens !== undefined) parts.push(`prompt ${metrics.prompt_tokens} tok`);
  if (metrics.completion_tokens !== undefined) parts.push(`completion ${metrics.completion_tokens} tok`);
  if (Array.isArray(metrics.logprobs) && metrics.logprobs.length) {
    const lp = metrics.logprobs.filter((v) => typeof v === "number");
    const mean = lp.reduce((a, b) => a + b, 0) / lp.length;
    parts.push(`logprob mean ${mean.toFixed(3)} min ${Math.min(...lp).toFixed(3)}`);
  }
  if (metrics.cost_usd !== undefined) parts.push(`$${metrics.cost_usd}`);
  return parts.length ? h("span", { class: "metrics" }, parts.join(" · ")) : null;
}

function asText(value) {
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

function stepView(step) {
  const results = (step.observation || {}).results || [];
  return h("div", { class: `step source-${step.source}`, "data-step": step.step_id },
    h("div", { class: "head" }, h("span", { class: "src" }, step.source), h("span", {}, `#${step.step_id}`),
      step.model_name ? h("span", {}, step.model_name) : null, metricsLine(step.metrics)),
    step.reasoning_content ? h("details", {}, h("summary", {}, "reasoning"), h("pre", {}, asText(step.reasoning_content))) : null,
    step.message !== undefined && step.message !== null && step.message !== "" ? h("div", { class: "message" }, asText(step.message)) : null,
    (step.tool_calls || []).map((call) => h("div", { class: "tool" }, h("span", { class: "name" }, `→ ${call.function_name}`), " ", h("span", { class: "muted" }, call.tool_call_id), h("pre", {}, asText(call.arguments)))),
    results.map((r) => h("div", { class: "tool observation" }, h("span", { class: "name" }, "← result"), " ", h("span", { class: "muted" }, r.source_call_id || ""), h("pre", {}, asText(r.content)))));
}

async function rolloutPage(runName, rolloutId, gen) {
  const [detail, items] = await Promise.all([
    api(`/api/runs/${enc(runName)}/rollouts/${enc(rolloutId)}`),
    api(`/api/runs/${enc(runName)}/items`),
  ]);
  current(gen);
  setCrumbs(h("a", { href: "#/" }, "runs"), h("a", { href: `#/run/${enc(runName)}` }, runName), rolloutId);
  const item = items.find((it) => it.rollout_id === rolloutId);
  const shown = detail.trajectory || detail.preview;
  const live = !detail.trajectory && detail.preview && !["success", "failure", "cancelled"].includes(detail.preview.extra.osmosis.status);
  const diagnostics = detail.diagnostics;
  const nodes = [h("h1", {}, "Rollout ", rolloutId)];
  if (item) {
    nodes.push(h("div", { class: "cards" }, card("status", item.status), card("reward", fmt(item.reward)),
      card("row / run", `${item.row_index} / ${item.run_index}`), card("tokens", fmt(item.tokens)), card("duration", `${fmt(item.duration_ms, 0)} ms`)));
  }
  if ((item && item.status === "failed") || diagnostics) {
    nodes.push(h("h2", {}, "Error"), h("div", { class: "error", id: "error" },
      h("div", {}, h("strong", {}, item && item.error_type ? item.error_type : "error"), diagnostics && diagnostics.exception_type ? ` · ${diagnostics.exception_type}` : "", diagnostics && diagnostics.phase ? ` in ${diagnostics.phase}` : ""),
      item && item.error_message ? h("p", { class: "error-message" }, item.error_message) : null,
      diagnostics && diagnostics.traceback ? h("details", { open: true }, h("summary", {}, "traceback"), h("pre", {}, diagnostics.traceback)) : null));
  }
  nodes.push(h("h2", {}, live ? "Live preview (updates while the rollout runs)" : "Trajectory"));
  const steps = h("div", { id: "steps" });
  const renderSteps = (doc) => steps.replaceChildren(...(doc ? doc.steps.map(stepView) : [h("p", { class: "muted" }, "No trajectory was saved for this rollout.")]));
  renderSteps(shown);
  nodes.push(steps);
  if (detail.artifacts.length) {
    nodes.push(h("h2", {}, "Artifacts"), h("ul", { id: "artifacts" }, detail.artifacts.map((a) =>
      h("li", {}, h("a", { href: `/api/runs/${enc(runName)}/rollouts/${enc(rolloutId)}/artifacts/${a.path.split("/").map(enc).join("/")}`, download: a.path.split("/").pop() }, a.path), ` (${a.size} bytes)`))));
  }
  show(...nodes);
  if (live) {
    refreshTimer = setInterval(async () => {
      try {
        const next = await api(`/api/runs/${enc(runName)}/rollouts/${enc(rolloutId)}`);
        if (next.trajectory) { clearInterval(refreshTimer); route(); return; }
        if (next.preview) renderSteps(next.preview);
      } catch (e) { /* the next tick tries again */ }
    }, 1500);
  }
}

async function route() {
  if (refreshTimer) { clearInterval(refreshTimer); refreshTimer = null; }
  const gen = ++generation;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  try {
    if (parts[0] === "run" && parts[1] && parts[2] === "rollout" && parts[3]) await rolloutPage(parts[1], parts[3], gen);
    else if (parts[0] === "run" && parts[1]) await runPage(parts[1], gen);
    else await runsPage(gen);
  } catch (error) {
    if (error instanceof Superseded) return;
    show(h("p", { class: "error" }, `Could not load this page: ${error.message}`));
  }
}

window.addEventListener("hashchange", route);
route();
