// Status page: polls /diagnose every 2 s and updates the page in place (dom.js: only what
// changed is touched, so a text selection survives a poll). Every value from the server goes
// in through text nodes, never innerHTML: stack frames and log lines come from the monitored
// processes. A cluster-wide monitor may hold thousands of jobs: the page lists them all from
// the summary view, and shows in full only the jobs with a problem (at most FULL_CARDS_MAX)
// and the one picked in the list (#job-ID), each fetched on its own. Times are shown with
// their zone (the browser's), since the people reading them may sit in several.
"use strict";

const POLL_MS = 2000;
const FULL_CARDS_MAX = 20;
// How each verdict is drawn: its colour (a class of style.css) and label, from the monitor's verdict
// catalogue (monitor/diagnosis/verdict_catalogue.py), sent in every answer (monitor.links.verdicts).
let verdictLooks = {};
// Jobs keep the place they first appeared in, so live jobs do not swap places on every poll.
const jobOrder = [];
const CHART_WINDOW_S = 300;
const CHART = { width: 640, height: 150, left: 52, right: 10, top: 10, bottom: 20 };
const LINE_COLORS = ["#3558c8", "#1a7f37", "#b35900", "#8e24aa", "#00838f", "#c62828", "#6d4c41", "#546e7a",
  "#d81b60", "#7cb342"];
// Verdict history and rank timelines: fetched when what they show changes, else at most every 10 s.
const SIDE_REFRESH_MS = 10000;
const HISTORY_SHOWN = 6;
// The rank timeline covers at most the chart's window, at least TIMELINE_MIN_S: a young job
// fills the bar instead of a sliver at its right end. The monitor groups ranks that behave alike
// (its timeline answer): the page draws TIMELINE_ROWS_MAX groups of states and CHART_LINES_MAX of
// progress at most, and counts the rest.
const TIMELINE_MIN_S = 60;
const TIMELINE_ROWS_MAX = 16;
const CHART_LINES_MAX = 8;
// A group's label shows this many characters of its ranks at most (its tooltip shows more).
const LABEL_RANKS_CHARS = 24;
const TITLE_RANKS_CHARS = 2000;
const histories = new Map();  // job_id -> { key, fetchedAt, data, pending }
const timelines = new Map();  // job_id -> { key, fetchedAt, data, pending }
// Jobs whose merged stack tree shows its native frames (folded by default).
const nativeShown = new Set();
let lastData = null;
// Suspect nodes (/api/v1/nodes/suspects): read again at most this often; the nodes shown.
const SUSPECTS_REFRESH_MS = 15000;
const SUSPECTS_SHOWN = 10;
const suspects = { fetchedAt: 0, pending: false };

function pad(n) {
  return String(n).padStart(2, "0");
}

// "UTC+01:00" for the browser's offset at that moment (summer time included), "UTC" at zero.
function zoneName(date) {
  const offset = -date.getTimezoneOffset();
  if (offset === 0) return "UTC";
  const abs = Math.abs(offset);
  return `UTC${offset > 0 ? "+" : "-"}${pad(Math.floor(abs / 60))}:${pad(abs % 60)}`;
}

// "14:03:07 UTC+01:00", with the date in front when it is not today.
function clock(t) {
  if (t === null || t === undefined) return "–";
  const date = new Date(t * 1000);
  const time = `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  const day = date.toDateString() === new Date().toDateString() ? ""
    : `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} `;
  return `${day}${time} ${zoneName(date)}`;
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  seconds = Math.max(0, seconds);
  if (seconds < 60) return `${seconds.toFixed(0)}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m${pad(Math.floor(seconds % 60))}s`;
  return `${Math.floor(seconds / 3600)}h${pad(Math.floor((seconds % 3600) / 60))}m`;
}

function orderJobs(jobs) {
  for (const job of [...jobs].reverse()) {
    if (!jobOrder.includes(job.job_id)) jobOrder.unshift(job.job_id);
  }
  const rank = (job) => jobOrder.indexOf(job.job_id);
  return [...jobs].sort((a, b) => rank(a) - rank(b));
}

function toneOf(verdict) {
  return (verdictLooks[verdict] || {}).tone || "";
}

function verdictLabel(verdict) {
  return (verdictLooks[verdict] || {}).label || verdict.replace(/_/g, " ");
}

function verdictBadge(verdict) {
  return el("span", { class: `verdict ${toneOf(verdict)}` }, verdictLabel(verdict).toUpperCase());
}

function listBlock(title, items) {
  if (!items || items.length === 0) return null;
  return el("div", { key: title }, el("h3", {}, title), el("ul", {}, ...items.map((item) => el("li", {}, item))));
}

function ranksText(ranks) {
  return `${ranks.length === 1 ? "rank" : "ranks"} ${rangeList(ranks)}`;
}

// "0-3,5,7,8" for rank numbers: as the server writes rank sets (monitor/present/rank_ranges.py).
function rangeList(ranks) {
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
  return parts.join(",");
}

// The server writes rank sets as ranges ("0,2-5"); one number is one rank.
function rangesText(ranges) {
  return `${/^\d+$/.test(ranges) ? "rank" : "ranks"} ${ranges}`;
}

// The ranges cut after ``chars`` characters at a comma ("0,2,4,…"): a group of scattered ranks
// can hold thousands of them.
function shortRanges(ranges, chars) {
  if (ranges.length <= chars) return ranges;
  const cut = ranges.lastIndexOf(",", chars);
  return `${ranges.slice(0, cut > 0 ? cut : chars)},…`;
}

// "rank 5", "ranks 0-4,6-1999 (1,999 ranks)": a timeline row's label.
function rowLabel(group) {
  const count = group.count > 1 ? ` (${group.count.toLocaleString("en")} ranks)` : "";
  return `${rangesText(shortRanges(group.ranks, LABEL_RANKS_CHARS))}${count}`;
}

// "3 more groups (12 ranks) not drawn", or null when nothing is left out.
function notDrawn(groupsLeft, ranksLeft) {
  if (groupsLeft <= 0) return null;
  return `${groupsLeft} more ${groupsLeft === 1 ? "group" : "groups"} (${ranksLeft.toLocaleString("en")} ` +
    `${ranksLeft === 1 ? "rank" : "ranks"}) not drawn`;
}

// A giant job has a launcher per node: the unusual ones (ended, or another number of workers than
// most) and the first few are listed, the rest counted (as the text answer does).
const LAUNCHERS_SHOWN = 8;

function launcherBlock(job) {
  const launchers = job.launchers || [];
  const kind = (l) => `${l.alive} ${l.worker_count}`;
  const counts = new Map();
  launchers.forEach((l) => counts.set(kind(l), (counts.get(kind(l)) || 0) + 1));
  const usual = [...counts.entries()].sort((a, b) => b[1] - a[1]).map(([k]) => k)[0];
  // Stable sort: the unusual first, each in the answer's order.
  const ordered = [...launchers].sort((a, b) => (kind(a) === usual) - (kind(b) === usual));
  const items = ordered.slice(0, LAUNCHERS_SHOWN).map((l) => {
    const where = l.node_rank === null && !l.nnodes ? "" : `, node ${l.node_rank ?? "?"} of ${l.nnodes ?? "?"}`;
    const top = l.top_frame ? `, at ${l.top_frame}` : "";
    return `${l.node} pid ${l.pid}${where}, ${l.worker_count} workers, ${l.alive ? "alive" : "ended"}${top}`;
  });
  const rest = ordered.slice(LAUNCHERS_SHOWN);
  if (rest.length) {
    const ended = rest.filter((l) => !l.alive).length;
    items.push(`… ${rest.length.toLocaleString("en")} more launchers (${(rest.length - ended).toLocaleString("en")} alive, ` +
      `${ended.toLocaleString("en")} ended)`);
  }
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
  const rows = job.ranks.map((r) => el("tr", { key: r.rank, class: culprits.has(r.rank) ? "culprit" : "" },
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
  const table = el("table", { key: "ranks" }, el("thead", {}, head), el("tbody", {}, ...rows));
  const total = job.ranks_total ?? job.ranks.length;
  if (total <= job.ranks.length) return table;
  // A giant job's answer lists a sample: say which, and where the rest are.
  const url = `/diagnose?format=json&job=${encodeURIComponent(job.job_id)}&ranks_offset=0&ranks_limit=1000`;
  return el("div", { key: "ranks", class: "ranks" },
    el("p", { class: "meta listed" }, `${job.ranks.length} of ${total.toLocaleString("en")} ranks listed ` +
      `(the culprits, then the lowest ranks); every rank, a page at a time: ${url}`),
    table);
}

// A giant job's ranks in groups (same state, same place): the culprits' groups first, then the biggest.
function rankGroupsBlock(job) {
  const groups = job.rank_groups || [];
  if (groups.length === 0 || (job.ranks_total ?? 0) <= job.ranks.length) return null;
  const head = el("tr", {}, ...["ranks", "count", "state", "where"].map((h) => el("th", {}, h)));
  const rows = groups.map((g) => el("tr", { key: `${g.state} ${g.where}`, class: g.culprit ? "culprit" : "" },
    el("td", { class: "ranges" }, g.ranks),
    el("td", { class: "num" }, g.count.toLocaleString("en")),
    el("td", { class: "state" }, g.state),
    el("td", { class: "frame" }, g.where ?? "–"),
  ));
  const more = (job.rank_groups_total ?? groups.length) - groups.length;
  return el("div", { key: "rank-groups", class: "rank-groups" },
    el("h3", {}, `Ranks by state and place (${(job.rank_groups_total ?? groups.length).toLocaleString("en")} groups)`),
    el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)),
    more > 0 ? el("p", { class: "meta" }, `${more} more ${more === 1 ? "group" : "groups"} not listed`) : null);
}

// The chart's lines: the monitor's groups of ranks that progress alike, over every rank (its
// timeline answer: culprits, the biggest group, then the slowest); until that answer comes, the
// listed ranks, those with identical points (a job-scope log) on one line.
function chartSeries(job) {
  const entry = timelines.get(job.job_id);
  const data = entry && entry.data;
  if (data && data.progress_groups) {
    return { series: data.progress_groups, groupsLeft: data.progress_groups_total - data.progress_groups.length,
      ranksLeft: data.progress_ranks_not_drawn };
  }
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
  const culprits = new Set(job.culprit_ranks);
  const all = [...byPoints.values()].map((s) => {
    const step = s.points[s.points.length - 1][1];
    return { ranks: rangeList(s.ranks), count: s.ranks.length, points: s.points, alive: s.alive,
      culprit: s.ranks.some((r) => culprits.has(r)), step_low: step, step_high: step };
  });
  const series = all.slice(0, CHART_LINES_MAX);
  return { series, groupsLeft: all.length - series.length,
    ranksLeft: all.slice(series.length).reduce((n, s) => n + s.count, 0) };
}

// "rank 5 (step 100)", "ranks 0-4,6-1999 (1,999 ranks, steps 99-100)": a line's legend entry.
function lineLabel(group) {
  const count = group.count > 1 ? `${group.count.toLocaleString("en")} ranks, ` : "";
  const steps = group.step_low === group.step_high ? `step ${group.step_high}` : `steps ${group.step_low}-${group.step_high}`;
  return `${rangesText(shortRanges(group.ranks, LABEL_RANKS_CHARS))} (${count}${steps})`;
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
  const { series, groupsLeft, ranksLeft } = chartSeries(job);
  if (series.length === 0) {
    return el("div", { key: "chart", class: "chart" }, el("h3", {}, "Progress"),
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
      svg("line", { class: `since ${toneOf(job.verdict)}`, x1: at, y1: CHART.top, x2: at, y2: bottom }),
      // The label sits on the side of the marker with more room.
      svg("text", { class: "tick since-label", y: CHART.top + 8,
        ...(at > CHART.left + plotW / 2 ? { x: at - 3, "text-anchor": "end" } : { x: at + 3 }) },
      `${job.verdict} since ${clock(job.since)}`),
    );
  }
  const legend = [];
  const paths = [];
  series.forEach((s, i) => {
    const color = LINE_COLORS[i % LINE_COLORS.length];
    const shown = lines[i];
    const last = s.points[s.points.length - 1];
    if (shown.length) {
      const d = shown.map(([t, step], j) => `${j ? "L" : "M"}${x(t).toFixed(1)},${y(step).toFixed(1)}`).join(" ");
      paths.push(svg("path", { key: `ranks ${s.ranks}`, class: s.culprit ? "series culprit" : "series", d, stroke: color,
        "data-ranks": s.ranks },
      svg("title", {}, `${rangesText(shortRanges(s.ranks, TITLE_RANKS_CHARS))}: step ${last[1]} at ${clock(last[0])}`)));
    }
    legend.push(el("span", { key: s.ranks, class: s.culprit ? "entry culprit" : "entry",
      title: rangesText(shortRanges(s.ranks, TITLE_RANKS_CHARS)) },
    el("span", { class: "swatch", style: `background: ${color}` }), lineLabel(s)));
  });
  // The first lines (the culprits') drawn last, on top of the lines of the many.
  parts.push(...paths.reverse());
  const left = notDrawn(groupsLeft, ranksLeft);
  const chart = svg("svg", {
    class: "progress", viewBox: `0 0 ${CHART.width} ${CHART.height}`, role: "img",
    "aria-label": `steps over the last ${CHART_WINDOW_S / 60} minutes`,
  }, ...parts);
  return el("div", { key: "chart", class: "chart" }, el("h3", {}, `Progress (step, last ${CHART_WINDOW_S / 60} min)`),
    chart, el("div", { class: "legend" }, ...legend), left ? el("p", { class: "meta" }, left) : null);
}

// --- verdict history and rank timelines: side data fetched per job, kept between polls ---

function historyKey(job) {
  return `${job.verdict}|${job.culprit_ranks.join(",")}`;
}

// The timeline (and the progress chart drawn from it) follows the verdict and its culprits at once,
// else it is fetched every SIDE_REFRESH_MS (a key over every rank's state would refetch it at nearly
// every poll of a big job in trouble). A job whose ranks are all listed follows its progress too; a
// giant job's chart is redrawn every SIDE_REFRESH_MS (its groups cost ~0.1 s of the monitor's CPU
// at 10,000 ranks).
function timelineKey(job) {
  const giant = (job.ranks_total ?? 0) > job.ranks.length;
  return giant ? historyKey(job) : `${historyKey(job)}|${job.last_progress_at}`;
}

function refreshSideData(jobs) {
  refreshEach(jobs, histories, historyKey, (id) => `/api/v1/jobs/${encodeURIComponent(id)}/history`);
  refreshEach(jobs, timelines, timelineKey, (id) => `/api/v1/jobs/${encodeURIComponent(id)}/timeline?limit=0&rows=${TIMELINE_ROWS_MAX}&lines=${CHART_LINES_MAX}`);
}

function refreshEach(jobs, cache, keyOf, urlOf) {
  const nowMs = Date.now();
  for (const job of jobs) {
    let entry = cache.get(job.job_id);
    if (!entry) cache.set(job.job_id, (entry = { key: null, fetchedAt: 0, data: null, pending: false }));
    if (entry.pending || (entry.key === keyOf(job) && nowMs - entry.fetchedAt < SIDE_REFRESH_MS)) continue;
    entry.pending = true;
    entry.key = keyOf(job);
    fetchSide(cache, job.job_id, entry, urlOf(job.job_id));
  }
  const live = new Set(jobs.map((job) => job.job_id));
  for (const id of [...cache.keys()]) if (!live.has(id)) cache.delete(id);
}

async function fetchSide(cache, jobId, entry, url) {
  try {
    const response = await fetch(url, { cache: "no-store" });
    if (response.ok) entry.data = await response.json();
  } catch (err) {
    // Keep what was shown; the next refresh tries again.
  } finally {
    entry.pending = false;
    entry.fetchedAt = Date.now();
  }
  if (lastData && cache.get(jobId) === entry) render(lastData.summary, lastData.detailed);
}

// When the job's current verdict was published: its newest history change, if that is this verdict.
function namedAt(job) {
  const entry = histories.get(job.job_id);
  const changes = (entry && entry.data && entry.data.history) || [];
  const last = changes[changes.length - 1];
  return last && last.verdict === job.verdict ? last.at : null;
}

// A bar of verdict spans (widths by duration) and the latest changes, newest first.
function historyBlock(job) {
  const entry = histories.get(job.job_id);
  const changes = (entry && entry.data && entry.data.history) || [];
  if (changes.length === 0) return null;
  const end = Math.max(job.now, changes[changes.length - 1].at);
  const segments = changes.map((c, i) => {
    const until = i + 1 < changes.length ? changes[i + 1].at : end;
    return el("span", {
      key: c.at, class: `seg ${toneOf(c.verdict)}`, style: `flex-grow: ${Math.max(0, until - c.at).toFixed(3)}`,
      title: `${c.verdict} ${clock(c.at)} – ${i + 1 < changes.length ? clock(until) : "now"}`,
    });
  });
  const recent = changes.slice(-HISTORY_SHOWN).reverse().map((c) => el("li", { key: c.at },
    el("span", { class: "meta" }, clock(c.at)), verdictBadge(c.verdict),
    c.culprit_ranks.length ? el("span", {}, ranksText(c.culprit_ranks)) : null,
    el("span", { class: "meta change-summary", title: c.summary }, c.summary)));
  return el("div", { key: "history", class: "history" },
    el("h3", { title: "each change at the time the monitor named it" },
      `Verdict history (${changes.length} ${changes.length === 1 ? "change" : "changes"}, as named)`),
    el("div", { class: "bar" }, ...segments), el("ol", { class: "changes" }, ...recent),
    capturesList(entry.data.captures || []), actionsList(entry.data.actions || []));
}

// The evidence captured at each incident (a tar per incident: monitor/storage/capture_store.py).
function capturesList(captures) {
  if (captures.length === 0) return null;
  return el("ul", { key: "captures", class: "captures" }, ...captures.slice(-HISTORY_SHOWN).reverse().map((c) =>
    el("li", { key: c.id },
      el("a", { href: `/api/v1/captures/${encodeURIComponent(c.id)}`, download: "", class: "capture" },
        `evidence captured ${clock(c.requested_at)}`),
      el("span", { class: "meta" },
        ` ${c.verdict}: ${c.nodes_received}/${c.nodes_asked} nodes, ${(c.bytes / 1024).toFixed(0)} KiB`))));
}

// What the opt-in actions did on the job's incidents (the audit log: monitor/engine/actions/).
function actionsList(actions) {
  if (actions.length === 0) return null;
  return el("ul", { key: "actions", class: "actions" }, ...actions.slice(-HISTORY_SHOWN).reverse().map((a, i) =>
    el("li", { key: `${a.at}-${i}` },
      el("span", { class: "meta" }, clock(a.at)),
      // Only what went wrong is marked: a dry run, an unattributed job's or a rate-limited decision
      // ran nothing on purpose, and says what it would have done (its target).
      el("span", { class: `outcome ${a.outcome === "failed" || a.outcome === "refused" ? "bad" : ""}` },
        ` action ${a.rule} (${a.kind}): ${a.outcome.replace("_", " ")} `),
      a.ran === false && a.target ? el("code", { class: "would", title: "not run" }, a.target) : null,
      el("span", { class: "meta", title: a.detail }, a.detail))));
}

function spanText(seconds) {
  return seconds >= 120 ? `${Math.round(seconds / 60)} min` : `${Math.round(seconds)} s`;
}

// Per group of ranks whose states changed alike (the monitor groups them: /api/v1/jobs/ID/timeline),
// its states over the recent past as coloured segments, each culprit on a row of its own first;
// the newest state runs on to the job's "now".
function timelineBlock(job) {
  const entry = timelines.get(job.job_id);
  const groups = (entry && entry.data && entry.data.groups) || [];
  if (groups.length === 0) return null;
  const now = job.now;
  const known = Math.min(...groups.map((g) => (g.spans.length ? g.spans[0][0] : now)));
  const windowS = Math.min(CHART_WINDOW_S, Math.max(TIMELINE_MIN_S, now - known));
  const from = now - windowS;
  const states = new Set();
  const rows = groups.map((group) => {
    const who = rangesText(shortRanges(group.ranks, LABEL_RANKS_CHARS));
    const segments = [];
    let at = from;
    group.spans.forEach(([start, end, state], i) => {
      const last = i === group.spans.length - 1;
      const s = Math.max(start, from);
      const e = last ? Math.max(end, now) : Math.min(end, now);
      if (e <= from || s >= e) return;
      if (s > at) segments.push(el("span", { key: `gap ${at}`, class: "seg none", style: `flex-grow: ${(s - at).toFixed(3)}`,
        title: "no state known" }));
      states.add(state);
      segments.push(el("span", {
        key: start, class: `seg st-${state}`, style: `flex-grow: ${(e - s).toFixed(3)}`,
        title: `${who}: ${state} ${clock(start)} – ${last ? "now" : clock(end)}`,
      }));
      at = e;
    });
    return el("div", { key: group.ranks, class: `trow${group.culprit ? " culprit" : ""}`, "data-rank": group.ranks },
      el("span", { class: "label", title: rangesText(shortRanges(group.ranks, TITLE_RANKS_CHARS)) },
        rowLabel(group)),
      el("div", { class: "tbar" }, ...segments));
  });
  const total = entry.data.groups_total ?? groups.length;
  const ranks = entry.data.ranks_total ?? 0;
  const grouped = total < ranks ? `; ${ranks.toLocaleString("en")} ranks in ${total} ${total === 1 ? "group" : "groups"} alike` : "";
  const left = notDrawn(total - groups.length, entry.data.ranks_not_drawn ?? 0);
  return el("div", { key: "timeline", class: "timeline" },
    el("h3", {}, `Rank states (last ${spanText(windowS)}${grouped})`),
    el("div", { class: "trows" }, ...rows),
    el("div", { class: "taxis" }, el("span", {}, clock(from)), el("span", {}, "now")),
    left ? el("p", { class: "meta" }, left) : null,
    el("div", { class: "legend" }, ...[...states].sort().map((state) => el("span", { key: state, class: "entry" },
      el("span", { class: `swatch st-${state}` }), state))));
}

// --- the merged stack tree ---

// The tree as rows, outermost frame first. Rows indent only where the tree branches, so a
// 60-frame chain stays readable. Folded, each chain of native frames is one row.
function treeRows(nodes, showNative, indent, parentMissing, path, rows) {
  for (const node of nodes) {
    const key = `${path}/${node.native ? "n" : "p"}:${node.frame}`;
    let last = node;
    if (node.native && !showNative) {
      const chain = [node];
      while (last.children.length === 1 && last.children[0].native) chain.push((last = last.children[0]));
      rows.push({ key, fold: chain.length, node, indent, parentMissing });
    } else {
      rows.push({ key, node, indent, parentMissing });
    }
    treeRows(last.children, showNative, last.children.length > 1 ? indent + 1 : indent, last.missing, key, rows);
  }
  return rows;
}

function countNative(nodes) {
  return nodes.reduce((n, node) => n + (node.native ? 1 : 0) + countNative(node.children), 0);
}

function stackTreeBlock(job) {
  const tree = job.stack_tree;
  if (!tree || tree.roots.length === 0) return null;
  const showNative = nativeShown.has(job.job_id);
  const natives = countNative(tree.roots);
  const rows = treeRows(tree.roots, showNative, 0, "", "", []).map((row) => {
    const { node } = row;
    const missing = node.missing
      ? el("span", { class: `missing${node.missing !== row.parentMissing ? " new" : ""}` }, `missing: ${rangesText(node.missing)}`)
      : null;
    const ranks = el("span", { class: "ranks" }, rangesText(node.ranks));
    const indent = { style: `padding-left: ${(1.1 * row.indent).toFixed(1)}em` };
    if (row.fold) {
      return el("div", { key: row.key, class: "node fold", ...indent }, ranks,
        el("button", { type: "button", class: "unfold", "data-native-toggle": job.job_id },
          `${row.fold} native ${row.fold === 1 ? "frame" : "frames"}`), missing);
    }
    return el("div", { key: row.key, class: `node${node.native ? " native" : ""}`, ...indent },
      ranks, el("span", { class: "frame" }, node.frame), missing);
  });
  const notes = [
    tree.without_stack ? `no stack from ${rangesText(tree.without_stack)}` : null,
    tree.not_merged ? `too many distinct stacks: ${rangesText(tree.not_merged)} not merged` : null,
  ].filter(Boolean);
  return el("div", { key: "stack-tree", class: "stack-tree" },
    el("h3", {}, "Merged stacks (outermost first)",
      natives ? el("button", { type: "button", class: "toggle-native", "data-native-toggle": job.job_id,
        "aria-pressed": String(showNative) }, `${showNative ? "fold" : "show"} ${natives} native frames`) : null),
    notes.length ? el("p", { class: "meta" }, notes.join(" · ")) : null,
    el("div", { class: "tree" }, ...rows));
}

function toggleNative(jobId) {
  if (nativeShown.has(jobId)) nativeShown.delete(jobId); else nativeShown.add(jobId);
  if (lastData) render(lastData.summary, lastData.detailed);
}

// --- links: the evidence download, Grafana, the runbook section for the verdict ---

// An http(s) address, or a path on this monitor (its own /runbook by default); never a script URL, nor
// "//host" or "/\host", which a browser reads as another site.
function webAddress(url) {
  return typeof url === "string" && /^(https?:\/\/|\/(?![\/\\]))/i.test(url) ? url : null;
}

function linksRow(job, links) {
  const grafana = webAddress(links && links.grafana);
  const runbook = webAddress(links && links.runbook);
  const section = runbook && (links.runbook_sections || {})[job.verdict];
  const id = encodeURIComponent(job.job_id);
  return el("div", { key: "links", class: "links" },
    el("a", { href: `/api/v1/jobs/${id}/evidence`, download: "", class: "evidence" }, "download evidence (JSON)"),
    grafana ? el("a", { href: grafana.split("{job}").join(id), class: "grafana", rel: "noopener noreferrer",
      target: "_blank" }, "Grafana") : null,
    runbook ? el("a", { href: section ? `${runbook.split("#")[0]}#${section}` : runbook, class: "runbook",
      rel: "noopener noreferrer", target: "_blank" }, section ? `runbook: ${verdictLabel(job.verdict)}` : "runbook") : null);
}

// The job's pace against its own best (monitor/ingest/pace.py): null until it settled.
function paceLine(pace) {
  if (!pace) return null;
  const ratio = pace.ratio >= 1.1 ? `1/${pace.ratio.toFixed(1)} of its best` : "at its best";
  const goodput = pace.goodput === null ? "" : ` · goodput ${(100 * pace.goodput).toFixed(0)}%`;
  return el("div", { key: "pace", class: pace.ratio >= 3 ? "meta pace slow" : "meta pace" },
    `pace: ${ratio} (progress every ${pace.now_s.toFixed(2)}s, at best ${pace.baseline_s.toFixed(2)}s)${goodput}`);
}

function jobCard(job, links) {
  const tone = toneOf(job.verdict);
  // Two times of one change: "since" is when the evidence says the state began (the stall's
  // start), "named" when the monitor published it, the time its verdict history records.
  const named = namedAt(job);
  const since = job.since === null ? null : el("span", {
    key: "since", class: "meta", title: "since: when the evidence says it began; named: when the monitor said so (the verdict history's time)",
  }, `since ${clock(job.since)}` + (named !== null && Math.abs(named - job.since) >= 1 ? ` · named ${clock(named)}` : ""));
  const known = job.names && job.names.display ? el("span", { key: "names", class: "names" }, job.names.display) : null;
  const meta = el("span", { key: "meta", class: "meta" },
    `world size ${job.world_size ?? "?"} · ${job.ranks_total ?? job.ranks.length} ranks seen · last report ${clock(job.last_report_at)}`);
  const culprits = job.culprit_ranks.length
    ? el("div", { key: "culprits", class: "meta" }, `culprit ranks: ${job.culprit_ranks.join(", ")}`) : null;
  const pace = paceLine(job.pace);
  const stacks = job.stacks_unavailable_reason
    ? el("div", { key: "no-stacks", class: "meta" }, `stacks unavailable: ${job.stacks_unavailable_reason}`) : null;
  const troubled = job.verdict !== "healthy";
  return el("section", { key: `job-${job.job_id}`, class: `job ${tone}`, id: `job-${job.job_id}` },
    el("h2", {}, verdictBadge(job.verdict), el("span", { key: "id" }, job.job_id), known, since, meta),
    linksRow(job, links),
    el("p", { class: "summary" }, job.summary),
    culprits, pace, stacks,
    el("div", { class: "lists" }, listBlock("Evidence", job.evidence), listBlock("Hints", job.hints),
      launcherBlock(job), orphanBlock(job)),
    el("div", { class: "over-time" }, progressChart(job), historyBlock(job)),
    timelineBlock(job),
    rankGroupsBlock(job),
    troubled ? stackTreeBlock(job) : null,
    rankTable(job),
  );
}

function render(summary, detailed) {
  lastData = { summary, detailed };
  const links = summary.monitor && summary.monitor.links;
  if (links && links.verdicts) verdictLooks = links.verdicts;
  const listed = orderJobs(summary.jobs);
  patch(document.getElementById("overview"), listed.map((job) =>
    el("a", { key: job.job_id, href: `#job-${job.job_id}` }, verdictBadge(job.verdict), job.job_id)));
  const cards = orderJobs(detailed).map((job) => jobCard(job, links));
  const total = summary.total_jobs ?? listed.length;
  let rest = null;
  if (total === 0) {
    rest = el("p", { key: "empty", class: "empty" }, "No jobs reported yet. Start hangwatch-agent on the training nodes.");
  } else if (cards.length < total) {
    const more = total - cards.length;
    rest = el("p", { key: "empty", class: "empty" },
      `${more} more ${more === 1 ? "job" : "jobs"} without a problem: pick one in the list above to see it in full.`);
  }
  patch(document.getElementById("jobs"), [...cards, rest].filter(Boolean));
}

function monitorNote(status) {
  if (!status || (!status.overloaded && !status.reports_shed_last_minute)) return "";
  return ` · monitor over capacity: ${status.reports_shed_last_minute} reports shed in the last minute, ` +
    `verdicts ${status.verdicts_age_s === null ? "?" : status.verdicts_age_s.toFixed(1)}s old`;
}

async function fetchJson(url, { missingIsEmpty = false } = {}) {
  const response = await fetch(url, { cache: "no-store" });
  // ?job=ID of a job the monitor does not hold (forgotten since, or a stale link) answers 404.
  if (missingIsEmpty && response.status === 404) return { jobs: [] };
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
    const url = `/diagnose?format=json&job=${encodeURIComponent(picked)}`;
    detailed.push(...(await fetchJson(url, { missingIsEmpty: true })).jobs);
  }
  return [summary, detailed];
}

// The nodes named as culprits in incidents of the most distinct jobs this week: drain candidates.
async function refreshSuspects() {
  if (suspects.pending || Date.now() - suspects.fetchedAt < SUSPECTS_REFRESH_MS) return;
  suspects.pending = true;
  try {
    const answer = await fetchJson(`/api/v1/nodes/suspects?limit=${SUSPECTS_SHOWN}`);
    patch(document.getElementById("suspects"), suspectsBlock(answer));
  } catch (err) {
    // Keep what was shown; the next poll tries again.
  } finally {
    suspects.pending = false;
    suspects.fetchedAt = Date.now();
  }
}

function suspectsBlock(answer) {
  if (!answer.nodes || answer.nodes.length === 0) return [];
  const days = Math.round(answer.window_s / 86400);
  const rows = answer.nodes.map((n) => el("tr", { key: n.node },
    el("td", { class: "node" }, n.node),
    el("td", {}, String(n.jobs_total)),
    el("td", {}, String(n.incidents)),
    el("td", {}, ...Object.entries(n.verdicts).sort((a, b) => b[1] - a[1])
      .map(([verdict, count]) => el("span", { key: verdict }, verdictBadge(verdict), ` ${count} `))),
    el("td", { class: "meta" }, clock(n.last_at)),
    el("td", { class: "meta jobs" }, n.jobs.slice(0, 5).join(", ") + (n.jobs.length > 5 ? ` (+${n.jobs.length - 5})` : ""))));
  return [
    el("h2", { key: "title" }, `Suspect nodes: culprits in the most jobs (last ${days} ${days === 1 ? "day" : "days"})`),
    el("table", { key: "table", class: "suspects" },
      el("thead", {}, el("tr", {}, ...["node", "jobs", "incidents", "verdicts", "last", "job ids"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows)),
  ];
}

function setStatus(text, isError) {
  const status = document.getElementById("status");
  patch(status, [text]);
  status.classList.toggle("error", Boolean(isError));
}

async function poll() {
  try {
    const [summary, detailed] = await fetchJobs();
    render(summary, detailed);
    refreshSideData(detailed);
    refreshSuspects();
    const note = monitorNote(summary.monitor);
    setStatus(`updated ${clock(Date.now() / 1000)}${note}`, Boolean(note));
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
    refreshSideData(detailed);
  }).catch(() => {}));
  // One listener for every fold button: the buttons come and go with the data.
  document.addEventListener("click", (event) => {
    const button = event.target.closest && event.target.closest("[data-native-toggle]");
    if (button) toggleNative(button.getAttribute("data-native-toggle"));
  });
}
poll();
