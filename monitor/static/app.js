// Status page: polls /diagnose every 2 s and redraws. Every value from the server goes in
// through textContent, never innerHTML: stack frames and log lines come from the monitored
// processes. A cluster-wide monitor may hold thousands of jobs: the page lists them all from
// the summary view, and shows in full only the jobs with a problem (at most FULL_CARDS_MAX)
// and the one picked in the list (#job-ID), each fetched on its own.
"use strict";

const POLL_MS = 2000;
const FULL_CARDS_MAX = 20;
const TONE = {
  healthy: "ok", finished: "info", straggler: "warn", slow_compute: "warn",
  deadlock: "bad", rank_exited: "bad", rank_stopped: "bad", rendezvous_hang: "bad", stalled: "bad", unknown: "warn",
};
// Jobs keep the place they first appeared in, so live jobs do not swap places on every poll.
const jobOrder = [];
// The SVG namespace is a name, not an address: nothing is fetched from it.
const SVG_NS = "http://www.w3.org/2000/svg";
const CHART_WINDOW_S = 300;
const CHART = { width: 640, height: 150, left: 52, right: 10, top: 10, bottom: 20 };
const LINE_COLORS = ["#3558c8", "#1a7f37", "#b35900", "#8e24aa", "#00838f", "#c62828", "#6d4c41", "#546e7a",
  "#d81b60", "#7cb342"];
// Verdict history: fetched when a job's verdict changes, else at most every 10 s.
const HISTORY_REFRESH_MS = 10000;
const HISTORY_SHOWN = 6;
const histories = new Map();  // job_id -> { key, fetchedAt, changes, pending }
let lastData = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  seconds = Math.max(0, seconds);
  if (seconds < 60) return `${seconds.toFixed(0)}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m${String(Math.floor(seconds % 60)).padStart(2, "0")}s`;
  return `${Math.floor(seconds / 3600)}h${String(Math.floor((seconds % 3600) / 60)).padStart(2, "0")}m`;
}

function clock(t) {
  return t === null || t === undefined ? "–" : new Date(t * 1000).toLocaleTimeString();
}

function orderJobs(jobs) {
  for (const job of [...jobs].reverse()) {
    if (!jobOrder.includes(job.job_id)) jobOrder.unshift(job.job_id);
  }
  const rank = (job) => jobOrder.indexOf(job.job_id);
  return [...jobs].sort((a, b) => rank(a) - rank(b));
}

function verdictBadge(verdict) {
  return el("span", { class: `verdict ${TONE[verdict] || ""}` }, verdict.toUpperCase().replace("_", " "));
}

function listBlock(title, items) {
  if (!items || items.length === 0) return null;
  return el("div", {}, el("h3", {}, title), el("ul", {}, ...items.map((item) => el("li", {}, item))));
}

function ranksText(ranks) {
  const sorted = [...ranks].sort((a, b) => a - b);
  const parts = [];
  for (let i = 0; i < sorted.length;) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j += 1;
    if (j === i) parts.push(String(sorted[i]));
    else if (j === i + 1) parts.push(`${sorted[i]},${sorted[j]}`);
    else parts.push(`${sorted[i]}-${sorted[j]}`);
    i = j + 1;
  }
  return `${sorted.length === 1 ? "rank" : "ranks"} ${parts.join(",")}`;
}

// STAT-style merged stacks: ranks with identical main-thread stacks, biggest group first.
function stackGroups(job) {
  const groups = job.stack_groups || [];
  if (groups.length === 0 || job.verdict === "healthy") return null;
  return el("div", { class: "groups" }, el("h3", {}, "Stacks (innermost first)"),
    el("ul", {}, ...groups.map((g) => el("li", {},
      el("span", { class: "ranks" }, `${ranksText(g.ranks)}: `),
      el("span", { class: "frame" }, g.frames.join(" ← "))))));
}

function launcherBlock(job) {
  const items = (job.launchers || []).map((l) => {
    const where = l.node_rank === null && !l.nnodes ? "" : `, node ${l.node_rank ?? "?"} of ${l.nnodes ?? "?"}`;
    const top = l.top_frame ? `, at ${l.top_frame}` : "";
    return `${l.node} pid ${l.pid}${where}, ${l.worker_count} workers, ${l.alive ? "alive" : "ended"}${top}`;
  });
  return listBlock("Launchers", items);
}

function orphanBlock(job) {
  const items = (job.orphans || []).map((o) => {
    const ports = o.listening_ports && o.listening_ports.length ? ` (listening on ${o.listening_ports.join(", ")})` : "";
    return `${o.node} pid ${o.pid}${ports}: ${o.cmdline}`;
  });
  return listBlock("Leftover processes (parent gone)", items);
}

function waitShare(r) {
  const share = r.collective_wait_share;
  return share === null || share === undefined ? "–" : (100 * share).toFixed(0);
}

function rankTable(job) {
  const culprits = new Set(job.culprit_ranks);
  const head = el("tr", {}, ...["rank", "node", "pid", "state", "CPU %", "wait %", "step", "no progress for", "top frame"]
    .map((h) => el("th", {}, h)));
  const rows = job.ranks.map((r) => el("tr", { class: culprits.has(r.rank) ? "culprit" : "" },
    el("td", { class: "num" }, r.rank),
    el("td", {}, r.node),
    el("td", { class: "num" }, r.pid ?? "–"),
    el("td", { class: "state" }, r.state),
    el("td", { class: "num" }, r.cpu_percent === null ? "–" : r.cpu_percent.toFixed(0)),
    el("td", { class: "num" }, waitShare(r)),
    el("td", { class: "num" }, r.step ?? "–"),
    el("td", { class: "num" }, ago(r.seconds_since_progress)),
    el("td", { class: "frame" }, r.top_frame ?? "–"),
  ));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows));
}

// Ranks with identical points (a job-scope log shared by all of them) share one line.
function chartSeries(job) {
  const byPoints = new Map();
  for (const r of job.ranks) {
    const points = r.progress || [];
    if (points.length === 0) continue;
    const key = JSON.stringify(points);
    if (!byPoints.has(key)) byPoints.set(key, { ranks: [], points, alive: false });
    const series = byPoints.get(key);
    series.ranks.push(r.rank);
    series.alive = series.alive || r.alive;
  }
  return [...byPoints.values()];
}

// Points inside [from, now]; the last one before ``from`` enters at the left edge, and a
// live rank's line runs flat to now, so a stall shows as a flat tail.
function visiblePoints(series, from, now) {
  const before = series.points.filter(([t]) => t < from);
  const inside = series.points.filter(([t]) => t >= from && t <= now);
  const shown = [...inside];
  if (before.length) {
    // Enter at the left edge on the line between the last point before and the first inside.
    const [t0, s0] = before[before.length - 1];
    const next = inside[0];
    shown.unshift([from, next && next[0] > t0 ? s0 + ((next[1] - s0) * (from - t0)) / (next[0] - t0) : s0]);
  }
  if (series.alive && shown.length && shown[shown.length - 1][0] < now) shown.push([now, shown[shown.length - 1][1]]);
  return shown;
}

function progressChart(job) {
  const series = chartSeries(job);
  if (series.length === 0) {
    return el("div", { class: "chart" }, el("h3", {}, "Progress"),
      el("p", { class: "meta" }, "no step numbers seen in the logs yet"));
  }
  const now = job.now;
  const from = now - CHART_WINDOW_S;
  const lines = series.map((s) => visiblePoints(s, from, now));
  const steps = lines.flat().map(([, step]) => step);
  let low = steps.length ? Math.min(...steps) : 0;
  let high = steps.length ? Math.max(...steps) : 1;
  if (high === low) { low -= 1; high += 1; }
  const plotW = CHART.width - CHART.left - CHART.right;
  const plotH = CHART.height - CHART.top - CHART.bottom;
  const x = (t) => CHART.left + ((t - from) / CHART_WINDOW_S) * plotW;
  const y = (step) => CHART.top + (1 - (step - low) / (high - low)) * plotH;
  const bottom = CHART.top + plotH;
  const parts = [
    svg("line", { class: "axis", x1: CHART.left, y1: bottom, x2: CHART.left + plotW, y2: bottom }),
    svg("line", { class: "axis", x1: CHART.left, y1: CHART.top, x2: CHART.left, y2: bottom }),
    svg("text", { class: "tick", x: CHART.left - 4, y: CHART.top + 8, "text-anchor": "end" }, Math.round(high)),
    svg("text", { class: "tick", x: CHART.left - 4, y: bottom, "text-anchor": "end" }, Math.round(low)),
    svg("text", { class: "tick", x: CHART.left, y: CHART.height - 4 }, `−${CHART_WINDOW_S / 60} min`),
    svg("text", { class: "tick", x: CHART.left + plotW, y: CHART.height - 4, "text-anchor": "end" }, "now"),
  ];
  if (job.verdict !== "healthy" && job.since !== null && job.since !== undefined) {
    const at = x(Math.min(now, Math.max(from, job.since)));
    parts.push(
      svg("line", { class: `since ${TONE[job.verdict] || ""}`, x1: at, y1: CHART.top, x2: at, y2: bottom }),
      // The label sits on the side of the marker with more room.
      svg("text", { class: "tick since-label", y: CHART.top + 8,
        ...(at > CHART.left + plotW / 2 ? { x: at - 3, "text-anchor": "end" } : { x: at + 3 }) },
      `${job.verdict} since ${clock(job.since)}`),
    );
  }
  const legend = [];
  series.forEach((s, i) => {
    const color = LINE_COLORS[i % LINE_COLORS.length];
    const shown = lines[i];
    const last = s.points[s.points.length - 1];
    if (shown.length) {
      const d = shown.map(([t, step], j) => `${j ? "L" : "M"}${x(t).toFixed(1)},${y(step).toFixed(1)}`).join(" ");
      parts.push(svg("path", { class: "series", d, stroke: color, "data-ranks": s.ranks.join(",") },
        svg("title", {}, `${ranksText(s.ranks)}: step ${last[1]} at ${clock(last[0])}`)));
    }
    legend.push(el("span", { class: "entry" }, el("span", { class: "swatch", style: `background: ${color}` }),
      `${ranksText(s.ranks)} (step ${last[1]})`));
  });
  const chart = svg("svg", {
    class: "progress", viewBox: `0 0 ${CHART.width} ${CHART.height}`, role: "img",
    "aria-label": `steps over the last ${CHART_WINDOW_S / 60} minutes`,
  }, ...parts);
  return el("div", { class: "chart" }, el("h3", {}, `Progress (step, last ${CHART_WINDOW_S / 60} min)`), chart,
    el("div", { class: "legend" }, ...legend));
}

function verdictKey(job) {
  return `${job.verdict}|${job.culprit_ranks.join(",")}`;
}

function refreshHistories(jobs) {
  const nowMs = Date.now();
  for (const job of jobs) {
    let h = histories.get(job.job_id);
    if (!h) histories.set(job.job_id, (h = { key: null, fetchedAt: 0, changes: null, pending: false }));
    if (h.pending || (h.key === verdictKey(job) && nowMs - h.fetchedAt < HISTORY_REFRESH_MS)) continue;
    h.pending = true;
    h.key = verdictKey(job);
    fetchHistory(job.job_id, h);
  }
  const live = new Set(jobs.map((job) => job.job_id));
  for (const id of [...histories.keys()]) if (!live.has(id)) histories.delete(id);
}

async function fetchHistory(jobId, h) {
  try {
    const response = await fetch(`/api/v1/jobs/${encodeURIComponent(jobId)}/history`, { cache: "no-store" });
    if (response.ok) h.changes = (await response.json()).history;
  } catch (err) {
    // Keep what was shown; the next refresh tries again.
  } finally {
    h.pending = false;
    h.fetchedAt = Date.now();
  }
  if (lastData && histories.get(jobId) === h) render(lastData.summary, lastData.detailed);
}

// A bar of verdict spans (widths by duration) and the latest changes, newest first.
function historyBlock(job) {
  const h = histories.get(job.job_id);
  const changes = (h && h.changes) || [];
  if (changes.length === 0) return null;
  const end = Math.max(job.now, changes[changes.length - 1].at);
  const segments = changes.map((c, i) => {
    const until = i + 1 < changes.length ? changes[i + 1].at : end;
    return el("span", {
      class: `seg ${TONE[c.verdict] || ""}`, style: `flex-grow: ${Math.max(0, until - c.at).toFixed(3)}`,
      title: `${c.verdict} ${clock(c.at)}–${i + 1 < changes.length ? clock(until) : "now"}`,
    });
  });
  const recent = changes.slice(-HISTORY_SHOWN).reverse().map((c) => el("li", {},
    el("span", { class: "meta" }, clock(c.at)), verdictBadge(c.verdict),
    c.culprit_ranks.length ? el("span", {}, ranksText(c.culprit_ranks)) : null,
    el("span", { class: "meta change-summary", title: c.summary }, c.summary)));
  return el("div", { class: "history" }, el("h3", {}, `Verdict history (${changes.length} ${changes.length === 1 ? "change" : "changes"})`),
    el("div", { class: "bar" }, ...segments), el("ol", { class: "changes" }, ...recent));
}

function jobCard(job) {
  const tone = TONE[job.verdict] || "";
  const since = job.since === null ? null : el("span", { class: "meta" }, `since ${clock(job.since)}`);
  const meta = el("span", { class: "meta" },
    `world size ${job.world_size ?? "?"} · ${job.ranks.length} ranks seen · last report ${clock(job.last_report_at)}`);
  const culprits = job.culprit_ranks.length
    ? el("div", { class: "meta" }, `culprit ranks: ${job.culprit_ranks.join(", ")}`) : null;
  const stacks = job.stacks_unavailable_reason
    ? el("div", { class: "meta" }, `stacks unavailable: ${job.stacks_unavailable_reason}`) : null;
  return el("section", { class: `job ${tone}`, id: `job-${job.job_id}` },
    el("h2", {}, verdictBadge(job.verdict), el("span", {}, job.job_id), since, meta),
    el("p", { class: "summary" }, job.summary),
    culprits, stacks,
    el("div", { class: "lists" }, listBlock("Evidence", job.evidence), listBlock("Hints", job.hints),
      launcherBlock(job), orphanBlock(job)),
    el("div", { class: "over-time" }, progressChart(job), historyBlock(job)),
    stackGroups(job),
    rankTable(job),
  );
}

function render(summary, detailed) {
  lastData = { summary, detailed };
  const listed = orderJobs(summary.jobs);
  const overview = document.getElementById("overview");
  overview.replaceChildren(...listed.map((job) =>
    el("a", { href: `#job-${job.job_id}` }, verdictBadge(job.verdict), job.job_id)));
  const main = document.getElementById("jobs");
  const cards = orderJobs(detailed).map(jobCard);
  const total = summary.total_jobs ?? listed.length;
  if (total === 0) {
    main.replaceChildren(el("p", { class: "empty" }, "No jobs reported yet. Start hangwatch-agent on the training nodes."));
  } else if (cards.length < total) {
    const rest = total - cards.length;
    main.replaceChildren(...cards, el("p", { class: "empty" },
      `${rest} more ${rest === 1 ? "job" : "jobs"} without a problem: pick one in the list above to see it in full.`));
  } else {
    main.replaceChildren(...cards);
  }
}

function monitorNote(status) {
  if (!status || (!status.overloaded && !status.reports_shed_last_minute)) return "";
  return ` · monitor over capacity: ${status.reports_shed_last_minute} reports shed in the last minute, ` +
    `verdicts ${status.verdicts_age_s === null ? "?" : status.verdicts_age_s.toFixed(1)}s old`;
}

async function fetchJson(url) {
  const response = await fetch(url, { cache: "no-store" });
  if (!response.ok) throw new Error(`HTTP ${response.status}`);
  return response.json();
}

function pickedJob() {
  const hash = typeof location === "undefined" ? "" : decodeURIComponent(location.hash || "");
  return hash.startsWith("#job-") ? hash.slice(5) : null;
}

async function fetchJobs() {
  const summary = await fetchJson("/diagnose?format=json&view=summary");
  const total = summary.total_jobs ?? summary.jobs.length;
  if (total <= FULL_CARDS_MAX) return [summary, (await fetchJson("/diagnose?format=json")).jobs];
  const detailed = (await fetchJson(`/diagnose?format=json&problems=1&limit=${FULL_CARDS_MAX}`)).jobs;
  const picked = pickedJob();
  if (picked && !detailed.some((job) => job.job_id === picked)) {
    detailed.push(...(await fetchJson(`/diagnose?format=json&job=${encodeURIComponent(picked)}`)).jobs);
  }
  return [summary, detailed];
}

function setStatus(text, isError) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.classList.toggle("error", Boolean(isError));
}

async function poll() {
  try {
    const [summary, detailed] = await fetchJobs();
    render(summary, detailed);
    refreshHistories(detailed);
    setStatus(`updated ${new Date().toLocaleTimeString()}${monitorNote(summary.monitor)}`, Boolean(monitorNote(summary.monitor)));
  } catch (err) {
    setStatus(`cannot reach the monitor (${err.message}); retrying`, true);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

if (typeof window !== "undefined" && window.addEventListener) {
  // Picking a job in the list shows it in full at once, not at the next poll.
  window.addEventListener("hashchange", () => fetchJobs().then(([summary, detailed]) => {
    render(summary, detailed);
    refreshHistories(detailed);
  }).catch(() => {}));
}
poll();
