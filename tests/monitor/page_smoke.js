// Runs monitor/static/app.js under a tiny fake DOM with canned answers and prints what the
// page would show. Used by test_page.py (no browser needed).
//   node page_smoke.js app.js diagnose.json [routes.json]
// routes.json maps URLs the page fetches (a job's history, a /diagnose view) to their JSON
// answers; any other /diagnose URL answers diagnose.json, anything else 404.
"use strict";
const fs = require("fs");
const vm = require("vm");

class Node {
  constructor(tag, ns) { this.tag = tag; this.ns = ns || null; this.children = []; this.attrs = {};
    this.className = ""; this._text = null; this.classList = { toggle: () => {} }; }
  append(...nodes) { this.children.push(...nodes); }
  replaceChildren(...nodes) { this.children = nodes; }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  set textContent(t) { this._text = String(t); this.children = []; }
  get textContent() { return this._text !== null ? this._text : this.children.map((c) => c.textContent).join(" "); }
  get cls() { return this.attrs.class || this.className || ""; }
}
class TextNode extends Node { constructor(t) { super("#text"); this._text = t; } }
const byId = {};
const document = {
  createElement: (tag) => new Node(tag),
  createElementNS: (ns, tag) => new Node(tag, ns),
  createTextNode: (t) => new TextNode(t),
  getElementById: (id) => (byId[id] = byId[id] || new Node("div")),
};
const data = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
const routes = process.argv[4] ? JSON.parse(fs.readFileSync(process.argv[4], "utf8")) : {};
const fetched = [];
let timers = 0;
const answer = (status, body) => ({ ok: status === 200, status, json: async () => body });
const context = {
  document, Node, console, JSON, Math, String, Object, Set, Map, Boolean, Error, Date, encodeURIComponent,
  fetch: async (url) => {
    fetched.push(url);
    if (url in routes) return answer(200, routes[url]);
    if (url.startsWith("/diagnose")) return answer(200, data);
    return answer(404, { detail: "not found" });
  },
  setTimeout: () => { timers += 1; },
};
vm.runInNewContext(fs.readFileSync(process.argv[2], "utf8"), context);

function findAll(node, pred, out = []) {
  if (pred(node)) out.push(node);
  for (const child of node.children) findAll(child, pred, out);
  return out;
}
const hasClass = (name) => (n) => n.cls.split(/\s+/).includes(name);

// Let the poll, the history fetches and the redraws they cause settle (the page's own
// timers are counted, not run).
setTimeout(() => {
  const jobs = {};
  for (const card of findAll(byId.jobs, (n) => n.tag === "section")) {
    const id = card.attrs.id.replace(/^job-/, "");
    const charts = findAll(card, (n) => n.tag === "svg");
    const history = findAll(card, hasClass("history"));
    jobs[id] = {
      charts: charts.length,
      svg_namespace: charts.map((c) => c.ns),
      paths: charts.flatMap((c) => findAll(c, (n) => n.tag === "path")).map((p) => ({ ranks: p.attrs["data-ranks"],
        d: p.attrs.d, stroke: p.attrs.stroke })),
      since_markers: charts.flatMap((c) => findAll(c, hasClass("since"))).length,
      legend: findAll(card, hasClass("legend")).map((n) => n.textContent).join(" "),
      chart_text: findAll(card, hasClass("chart")).map((n) => n.textContent).join(" "),
      history: history.map((n) => n.textContent).join(" "),
      history_segments: history.flatMap((n) => findAll(n, hasClass("seg"))).map((s) => s.cls),
    };
  }
  console.log(JSON.stringify({ status: byId.status.textContent, overview: byId.overview.textContent,
                               jobs: byId.jobs.textContent, timers, fetched, cards: jobs }));
}, 200);
