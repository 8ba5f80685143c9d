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

const CHART = { width: 320, height: 160, left: 24, right: 48, top: 32, bottom: 24 };

// A line through `points` ({x, y, tip}) with a dot on each, and `marks` (other points, drawn
// as rings). `x` and `y` map a value to its fraction (0 to 1) of the plot area;
// `decorate(svg, px, py, frame)` adds labels in pixels.
function lineChart(title, points, { x, y, marks = [], decorate = () => {}, frame = CHART }) {
  const { width, height, left, right, top, bottom } = frame;
  const px = (v) => left + x(v) * (width - left - right);
  const py = (v) => height - bottom - y(v) * (height - top - bottom);
  const svg = h("svg", { width, height, role: "img", "aria-label": title });
  svg.append(h("line", { class: "axis", x1: left, y1: height - bottom, x2: width - right, y2: height - bottom }));
  svg.append(h("polyline", { class: "line", points: points.map((p) => `${px(p.x)},${py(p.y)}`).join(" ") }));
  for (const p of points) svg.append(h("circle", { class: "dot", cx: px(p.x), cy: py(p.y), r: 3 }, h("title", {}, p.tip)));
  for (const m of marks) svg.append(h("circle", { class: "mark", cx: px(m.x), cy: py(m.y), r: 5 }, h("title", {}, m.tip)));
  decorate(svg, px, py, frame);
  svg.append(h("text", { x: left, y: 12 }, title));
  return h("div", { class: "chart" }, svg);
}

function passAtK(points, title = "pass@k") {
  // The right margin holds the widest value label ("100.0%") beside the last point; the top
  // one keeps a label at 100% clear of the title.
  if (!points.length) return h("div", { class: "chart" }, h("div", { class: "muted" }, `${title}: no runs yet`));
  const maxK = Math.max(...points.map((p) => p.k));
  const line = points.map((p) => ({ x: p.k, y: p.value, tip: `pass@${p.k} = ${pct(p.value)}` }));
  return lineChart(title, line, {
    x: (k) => (points.length === 1 ? 0.5 : Math.log2(k) / Math.log2(maxK)),
    y: (v) => v,
    decorate: (svg, px, py, frame) => {
      for (const p of points) {
        svg.append(h("text", { x: px(p.k), y: frame.height - 8, "text-anchor": "middle" }, `k=${p.k}`));
        svg.append(h("text", { class: "value", x: px(p.k) + 5, y: py(p.value) - 5 }, pct(p.value)));
      }
    },
  });
}

// A number short enough for a chart's margin: 3 significant digits, or an exponent.
const short = (v) => (v !== 0 && (Math.abs(v) >= 1e5 || Math.abs(v) < 1e-3) ? v.toExponential(1) : String(Number(v.toPrecision(3))));
const TRAIN_CHART = { ...CHART, width: 540, height: 180, right: 56 };

// One metric of a training run per step: a point per step that has a value, and `marks`
// (held-out evaluations) on the same axes. `range` fixes the y axis (rates: 0 to 1).
function stepChart(title, metrics, key, { marks = [], range = null } = {}) {
  const points = metrics.filter((m) => typeof m[key] === "number").map((m) => ({ x: m.step, y: m[key], tip: `step ${m.step}: ${short(m[key])}` }));
  const all = [...points, ...marks];
  if (!all.length) return h("div", { class: "chart" }, h("div", { class: "muted" }, `${title}: no steps yet`));
  const x0 = Math.min(...all.map((p) => p.x)), x1 = Math.max(...all.map((p) => p.x));
  let [y0, y1] = range || [Math.min(...all.map((p) => p.y)), Math.max(...all.map((p) => p.y))];
  if (y0 === y1) { y0 -= Math.abs(y0) / 2 || 0.5; y1 += Math.abs(y1) / 2 || 0.5; }
  return lineChart(title, points, {
    x: (v) => (x1 === x0 ? 0.5 : (v - x0) / (x1 - x0)),
    y: (v) => (v - y0) / (y1 - y0),
    marks,
    frame: TRAIN_CHART,
    decorate: (svg, px, py, frame) => {
      const edge = frame.width - frame.right + 6;
      svg.append(h("text", { x: edge, y: py(y1) + 4 }, short(y1)), h("text", { x: edge, y: py(y0) + 4 }, short(y0)));
      svg.append(h("text", { x: px(x0), y: frame.height - 8, "text-anchor": "middle" }, `step ${x0}`));
      if (x1 !== x0) svg.append(h("text", { x: px(x1), y: frame.height - 8, "text-anchor": "middle" }, `step ${x1}`));
      if (marks.length) svg.append(h("text", { class: "legend", x: frame.width - frame.right, y: 12, "text-anchor": "end" }, "● per step  ○ held-out"));
    },
  });
}

// ---- pages -------------------------------------------------------------------------------

async function runsPage(gen) {
  const [runs, trainRuns] = await Promise.all([api("/api/runs"), api("/api/train")]);
  current(gen);
  setCrumbs("runs");
  const evals = runs.length ? evalRunsTable(runs) : h("p", { class: "muted" }, "No eval runs here yet.");
  show(h("h1", {}, "Runs"), evals, trainRuns.length ? trainRunsTable(trainRuns) : null);
}

function evalRunsTable(runs) {
  const rows = runs.map((run) =>
    h("tr", { class: "clickable", "data-run": run.name, onclick: () => (location.hash = `#/run/${enc(run.name)}`) },
      h("td", {}, h("a", { href: `#/run/${enc(run.name)}` }, run.name)),
      h("td", {}, fmt(run.created_at)), h("td", {}, fmt(run.rollout)), h("td", {}, fmt(run.model)),
      statusCell(run),
      h("td", {}, fmt(run.total_samples)),
      h("td", {}, pct(run.pass_rate)), h("td", {}, fmt(run.mean_reward))));
  return h("table", { id: "runs" },
    h("thead", {}, h("tr", {}, ["run", "created", "rollout", "model", "status", "samples", "pass rate", "mean reward"].map((c) => h("th", {}, c)))),
    h("tbody", {}, rows));
}

function statusCell(run) {
  return h("td", { class: `status-${run.status}` }, run.status, run.problem ? h("div", { class: "problem" }, run.problem) : null);
}

// A held-out figure before and after training ("–" for an evaluation not made yet).
function beforeAfter(run, figure) {
  const value = (point) => (point ? figure(point) : "–");
  return `${value(run.held_out_before)} → ${value(run.held_out_after)}`;
}
const heldOutPass = (point) => pct(point.pass_rate);
const heldOutReward = (point) => fmt(point.mean_reward, 3);

function trainRunsTable(runs) {
  const rows = runs.map((run) =>
    h("tr", { class: "clickable", "data-run": run.name, onclick: () => (location.hash = `#/train/${enc(run.name)}`) },
      h("td", {}, h("a", { href: `#/train/${enc(run.name)}` }, run.name)),
      h("td", {}, fmt(run.model)), statusCell(run),
      h("td", { class: "steps" }, `${fmt(run.steps_done)} / ${fmt(run.steps_total)}`),
      h("td", { class: "last-reward" }, fmt(run.last_reward)),
      h("td", { class: "held-out" }, beforeAfter(run, heldOutPass)),
      h("td", { class: "held-out-reward" }, beforeAfter(run, heldOutReward))));
  const columns = ["run", "model", "status", "steps", "last reward", "held-out pass rate (before → after)", "held-out mean reward (before → after)"];
  return h("div", {}, h("h2", {}, "Training runs"), h("table", { id: "train-runs" },
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c)))),
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

// ---- training runs ---------------------------------------------------------------------

const STEP_COLUMNS = [
  ["step", "step", 0], ["reward_mean", "reward", 3], ["reward_std", "std", 3], ["pass_rate", "pass rate", 2],
  ["loss", "loss", 4], ["kl", "KL", 4], ["clip_fraction", "clipped", 3], ["grad_norm", "grad norm", 3],
  ["tokens_generated", "tokens gen.", 0], ["tokens_trained", "tokens trained", 0], ["tokens_per_sec", "tok/s", 1],
  ["generation_sec", "rollouts (s)", 1], ["update_sec", "update (s)", 1], ["drift", "drift", 0],
  ["zero_gradient_groups", "zero-grad groups", 0],
];
// Asynchronous training's columns (`max_staleness`), for runs whose steps record them.
const ASYNC_COLUMNS = [
  ["staleness_max", "stale max", 0], ["groups_waited", "groups waited", 0], ["importance_ratio_max", "ratio max", 3],
  ["learner_idle_fraction", "learner idle", 2], ["generator_idle_fraction", "engine idle", 2],
];
const FRACTIONS = new Set(["pass_rate", "learner_idle_fraction", "generator_idle_fraction"]);

function stepsTable(runName, metrics, selected) {
  const columns = metrics.some((m) => "staleness_max" in m) ? [...STEP_COLUMNS, ...ASYNC_COLUMNS] : STEP_COLUMNS;
  return h("table", { id: "train-steps" },
    h("thead", {}, h("tr", {}, columns.map(([, label]) => h("th", {}, label)))),
    h("tbody", {}, metrics.map((m) =>
      h("tr", { class: `clickable${m.step === selected ? " selected" : ""}`, "data-step": m.step, onclick: () => (location.hash = `#/train/${enc(runName)}/step/${m.step}`) },
        columns.map(([key, , digits]) => h("td", {}, FRACTIONS.has(key) ? pct(m[key]) : fmt(m[key], digits)))))));
}

const ROLLOUT_COLUMNS = [["kind", "kind"], ["row_index", "row"], ["run_index", "sample"], ["status", "status"], ["reward", "reward"], ["tokens", "tokens"], ["error_type", "error type"]];

function stepRollouts(runName, step, rollouts) {
  const body = rollouts.length
    ? h("table", { id: "rollouts" },
        h("thead", {}, h("tr", {}, h("th", {}, "rollout"), ROLLOUT_COLUMNS.map(([, label]) => h("th", {}, label)))),
        h("tbody", {}, rollouts.map((r) =>
          h("tr", { class: "clickable", "data-rollout": r.rollout_id, onclick: () => (location.hash = `#/train/${enc(runName)}/rollout/${enc(r.rollout_id)}`) },
            h("td", {}, r.rollout_id),
            ROLLOUT_COLUMNS.map(([key]) => h("td", key === "status" ? { class: `status-${r.status}` } : {}, fmt(r[key])))))))
    : h("p", { class: "muted" }, "No rollout of this step has finished yet.");
  return h("div", { id: "step-rollouts" }, h("h2", {}, `Step ${step}: rollouts`), body);
}

// The fourth chart: the KL penalty's KL when the run has one; else how far the engine's
// logprobs are from the learner's (when the engine reports it); else the gradient norm.
function fourthChart(run) {
  if (run.kl_beta) return stepChart("KL", run.metrics, "kl");
  if (run.metrics.some((m) => typeof m.engine_mismatch_kl === "number")) {
    return stepChart("engine/learner mismatch (KL)", run.metrics, "engine_mismatch_kl");
  }
  return stepChart("grad norm", run.metrics, "grad_norm");
}

// pass@k of several samples per held-out row: a card (before → after) and the last
// evaluation's curve.
function heldOutPassAtK(run) {
  const last = run.evals.length ? run.evals[run.evals.length - 1] : null;
  if (!last || !last.pass_at_k.length) return { card: null, chart: null };
  const maxK = Math.max(...last.pass_at_k.map((p) => p.k));
  const atK = (point) => {
    const found = (point.pass_at_k || []).find((p) => p.k === maxK);
    return found ? pct(found.value) : "–";
  };
  return {
    card: card(`held-out pass@${maxK}`, beforeAfter(run, atK)),
    chart: passAtK(last.pass_at_k, `held-out pass@k (after step ${last.step})`),
  };
}

function trainView(runName, run, step, rollouts) {
  const title = h("h1", {}, run.name, " ", h("span", { class: `pill status-${run.status}` }, run.status));
  if (run.problem) return [title, h("div", { class: "error", id: "problem" }, "This run cannot be read: ", run.problem)];
  const metrics = run.metrics;
  const tip = (e) => `held-out after step ${e.step}: pass rate ${pct(e.pass_rate)}, mean reward ${fmt(e.mean_reward, 3)}`;
  const passMarks = run.evals.map((e) => ({ x: e.step, y: e.pass_rate, tip: tip(e) }));
  const rewardMarks = run.evals.filter((e) => typeof e.mean_reward === "number").map((e) => ({ x: e.step, y: e.mean_reward, tip: tip(e) }));
  const atK = heldOutPassAtK(run);
  return [
    title,
    h("p", { class: "muted" }, `${fmt(run.model)} · ${fmt(run.steps_done)} of ${fmt(run.steps_total)} steps`),
    h("div", { class: "cards" },
      card("steps", `${fmt(run.steps_done)} / ${fmt(run.steps_total)}`), card("last reward", fmt(run.last_reward)),
      card("held-out pass rate", beforeAfter(run, heldOutPass)), card("held-out mean reward", beforeAfter(run, heldOutReward)),
      atK.card),
    h("p", { class: "muted definitions" },
      h("strong", {}, "pass rate"), " per step = the step's rollouts whose reward reaches the run's pass threshold; ",
      h("strong", {}, "held-out"), " = the held-out rows' rollouts at the start, every eval_every steps and at the end (rings on the reward and pass-rate charts)."),
    h("div", { class: "charts" },
      stepChart("reward", metrics, "reward_mean", { marks: rewardMarks }), stepChart("pass rate", metrics, "pass_rate", { marks: passMarks, range: [0, 1] }),
      stepChart("loss", metrics, "loss"), fourthChart(run), atK.chart),
    h("h2", {}, "Steps"),
    metrics.length ? stepsTable(runName, metrics, step) : h("p", { class: "muted" }, "No step applied yet."),
    step === null ? h("p", { class: "muted" }, "Click a step to list its rollouts.") : stepRollouts(runName, step, rollouts),
  ];
}

// `osmosis train run --view` prints the page's address before the run writes its first line:
// an unknown run is waited for, a minute at most.
async function waitForRun(load, gen) {
  for (let attempt = 0; ; attempt += 1) {
    try {
      return await load();
    } catch (error) {
      if (attempt >= 40 || error.message !== "no such run") throw error;
      current(gen);
      show(h("p", { class: "muted", id: "waiting" }, "Waiting for the run to start…"));
      await new Promise((resolve) => setTimeout(resolve, 1500));
      current(gen);
    }
  }
}

async function trainPage(runName, step, gen) {
  const base = `/api/train/${enc(runName)}`;
  const load = () => Promise.all([api(base), step === null ? [] : api(`${base}/steps/${step}`)]);
  let [run, rollouts] = await waitForRun(load, gen);
  current(gen);
  const stepCrumb = step === null ? [] : [`step ${step}`];
  setCrumbs(h("a", { href: "#/" }, "runs"), step === null ? runName : h("a", { href: `#/train/${enc(runName)}` }, runName), ...stepCrumb);
  const page = h("div", { id: "train" });
  const draw = () => page.replaceChildren(...trainView(runName, run, step, rollouts));
  draw();
  show(page);
  if (run.status !== "running") return;
  // A live run: the curves and the step's rollouts grow until it stops.
  refreshTimer = setInterval(async () => {
    try { [run, rollouts] = await load(); } catch (e) { return; /* the next tick tries again */ }
    if (gen !== generation) return;
    draw();
    if (run.status !== "running") { clearInterval(refreshTimer); refreshTimer = null; }
  }, 1500);
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
  const turnReward = ((step.extra || {}).osmosis || {}).turn_reward;
  return h("div", { class: `step source-${step.source}`, "data-step": step.step_id },
    h("div", { class: "head" }, h("span", { class: "src" }, step.source), h("span", {}, `#${step.step_id}`),
      step.model_name ? h("span", {}, step.model_name) : null, metricsLine(step.metrics),
      typeof turnReward === "number" ? h("span", { class: "turn-reward" }, `turn reward ${fmt(turnReward, 3)}`) : null),
    step.reasoning_content ? h("details", {}, h("summary", {}, "reasoning"), h("pre", {}, asText(step.reasoning_content))) : null,
    step.message !== undefined && step.message !== null && step.message !== "" ? h("div", { class: "message" }, asText(step.message)) : null,
    (step.tool_calls || []).map((call) => h("div", { class: "tool" }, h("span", { class: "name" }, `→ ${call.function_name}`), " ", h("span", { class: "muted" }, call.tool_call_id), h("pre", {}, asText(call.arguments)))),
    results.map((r) => h("div", { class: "tool observation" }, h("span", { class: "name" }, "← result"), " ", h("span", { class: "muted" }, r.source_call_id || ""), h("pre", {}, asText(r.content)))));
}

// A rollout of an eval run (`kind` "eval") or of a training run ("train").
async function rolloutPage(kind, runName, rolloutId, gen) {
  const train = kind === "train";
  const base = `/api/${train ? "train" : "runs"}/${enc(runName)}`;
  const [detail, items] = await Promise.all([
    api(`${base}/rollouts/${enc(rolloutId)}`),
    train ? [] : api(`${base}/items`),
  ]);
  current(gen);
  const item = train ? detail.item : items.find((it) => it.rollout_id === rolloutId);
  const runLink = h("a", { href: `#/${train ? "train" : "run"}/${enc(runName)}` }, runName);
  const stepLink = train && item ? [h("a", { href: `#/train/${enc(runName)}/step/${item.step}` }, `step ${item.step}`)] : [];
  setCrumbs(h("a", { href: "#/" }, "runs"), runLink, ...stepLink, rolloutId);
  const shown = detail.trajectory || detail.preview;
  const live = !detail.trajectory && detail.preview && !["success", "failure", "cancelled"].includes(detail.preview.extra.osmosis.status);
  const diagnostics = detail.diagnostics;
  const nodes = [h("h1", {}, "Rollout ", rolloutId)];
  if (item) {
    nodes.push(h("div", { class: "cards" }, card("status", item.status), card("reward", fmt(item.reward)),
      card("row / run", `${item.row_index} / ${item.run_index}`), card("tokens", fmt(item.tokens)), item.duration_ms === undefined ? null : card("duration", `${fmt(item.duration_ms, 0)} ms`)));
  }
  if ((item && item.status === "failed") || diagnostics) {
    nodes.push(h("h2", {}, "Error"), h("div", { class: "error", id: "error" },
      h("div", {}, h("strong", {}, item && item.error_type ? item.error_type : "error"), diagnostics && diagnostics.exception_type ? ` · ${diagnostics.exception_type}` : "", diagnostics && diagnostics.phase ? ` in ${diagnostics.phase}` : ""),
      item && item.error_message ? h("p", { class: "error-message" }, item.error_message) : null,
      diagnostics && diagnostics.traceback ? h("details", { open: true }, h("summary", {}, "traceback"), h("pre", {}, diagnostics.traceback)) : null));
  }
  if (detail.judges && detail.judges.length) {
    nodes.push(h("h2", {}, "Judge"), h("div", { id: "judges" }, detail.judges.map((v) =>
      h("div", { class: "judge" },
        h("div", {}, h("strong", {}, v.kind), ` · score ${fmt(v.score, 3)}`, Array.isArray(v.range) ? ` of [${v.range.map((x) => fmt(x)).join(", ")}]` : "",
          v.of ? ` · attempt ${v.attempt} of ${v.of}` : ""),
        h("p", { class: "judge-reasoning" }, asText(v.reasoning))))));
  }
  nodes.push(h("h2", {}, live ? "Live preview (updates while the rollout runs)" : "Trajectory"));
  const steps = h("div", { id: "steps" });
  const renderSteps = (doc) => steps.replaceChildren(...(doc ? doc.steps.map(stepView) : [h("p", { class: "muted" }, "No trajectory was saved for this rollout.")]));
  renderSteps(shown);
  nodes.push(steps);
  if (detail.artifacts.length) {
    nodes.push(h("h2", {}, "Artifacts"), h("ul", { id: "artifacts" }, detail.artifacts.map((a) =>
      h("li", {}, h("a", { href: `${base}/rollouts/${enc(rolloutId)}/artifacts/${a.path.split("/").map(enc).join("/")}`, download: a.path.split("/").pop() }, a.path), ` (${a.size} bytes)`))));
  }
  show(...nodes);
  if (live) {
    refreshTimer = setInterval(async () => {
      try {
        const next = await api(`${base}/rollouts/${enc(rolloutId)}`);
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
    if (parts[0] === "run" && parts[1] && parts[2] === "rollout" && parts[3]) await rolloutPage("eval", parts[1], parts[3], gen);
    else if (parts[0] === "run" && parts[1]) await runPage(parts[1], gen);
    else if (parts[0] === "train" && parts[1] && parts[2] === "rollout" && parts[3]) await rolloutPage("train", parts[1], parts[3], gen);
    else if (parts[0] === "train" && parts[1]) await trainPage(parts[1], parts[2] === "step" && /^\d+$/.test(parts[3] || "") ? Number(parts[3]) : null, gen);
    else await runsPage(gen);
  } catch (error) {
    if (error instanceof Superseded) return;
    show(h("p", { class: "error" }, `Could not load this page: ${error.message}`));
  }
}

window.addEventListener("hashchange", route);
route();
