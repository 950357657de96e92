// Status page: polls /diagnose?format=json every 2 s and redraws. Every value from the
// server goes in through textContent, never innerHTML: stack frames and log lines come
// from the monitored processes.
"use strict";

const POLL_MS = 2000;
const TONE = {
  healthy: "ok", finished: "info", straggler: "warn", slow_compute: "warn",
  deadlock: "bad", rank_exited: "bad", rank_stopped: "bad", rendezvous_hang: "bad", stalled: "bad",
};
// Jobs keep the place they first appeared in, so live jobs do not swap places on every poll.
const jobOrder = [];

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
    stackGroups(job),
    rankTable(job),
  );
}

function render(data) {
  const jobs = orderJobs(data.jobs);
  const overview = document.getElementById("overview");
  overview.replaceChildren(...jobs.map((job) =>
    el("a", { href: `#job-${job.job_id}` }, verdictBadge(job.verdict), job.job_id)));
  const main = document.getElementById("jobs");
  if (jobs.length === 0) {
    main.replaceChildren(el("p", { class: "empty" }, "No jobs reported yet. Start hangwatch-agent on the training nodes."));
  } else {
    main.replaceChildren(...jobs.map(jobCard));
  }
}

function setStatus(text, isError) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.classList.toggle("error", Boolean(isError));
}

async function poll() {
  try {
    const response = await fetch("/diagnose?format=json", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    render(await response.json());
    setStatus(`updated ${new Date().toLocaleTimeString()}`, false);
  } catch (err) {
    setStatus(`cannot reach the monitor (${err.message}); retrying`, true);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
