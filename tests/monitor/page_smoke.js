// Runs the status page's scripts (monitor/web/static/dom.js, app.js) under a tiny fake DOM with
// canned answers and prints what the page would show. Used by test_page.py (no browser needed).
//   node page_smoke.js STATIC_DIR diagnose.json [routes.json [polls]]
// routes.json maps URLs the page fetches (a job's history or timeline, a /diagnose view) to their
// JSON answers; any other /diagnose URL answers diagnose.json, anything else 404. With polls = 2
// the page's next poll runs too, and the output says how many DOM nodes the second poll made
// and whether every node of the first is still in place (an in-place update makes none).
"use strict";
const fs = require("fs");
const path = require("path");
const vm = require("vm");

let created = 0;
class Node {
  constructor(tag, ns) {
    created += 1;
    this.tag = tag; this.ns = ns || null; this.childNodes = []; this.attrs = {}; this.parentNode = null;
    this.nodeType = 1; this.classList = { toggle: () => {} };
  }
  get children() { return this.childNodes; }
  append(...nodes) { for (const n of nodes) this.insertBefore(n, null); }
  insertBefore(node, ref) {
    if (node.parentNode) node.parentNode.removeChild(node);
    const at = ref === null ? this.childNodes.length : this.childNodes.indexOf(ref);
    if (at < 0) throw new Error("insertBefore: reference is not a child");
    this.childNodes.splice(at, 0, node);
    node.parentNode = this;
    return node;
  }
  removeChild(node) {
    const at = this.childNodes.indexOf(node);
    if (at < 0) throw new Error("removeChild: not a child");
    this.childNodes.splice(at, 1);
    node.parentNode = null;
    return node;
  }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  removeAttribute(k) { delete this.attrs[k]; }
  getAttribute(k) { return k in this.attrs ? this.attrs[k] : null; }
  get textContent() { return this.childNodes.map((c) => c.textContent).join(" "); }
  get cls() { return this.attrs.class || ""; }
}
class TextNode extends Node {
  constructor(t) { super("#text"); this.nodeType = 3; this.nodeValue = t; }
  get textContent() { return this.nodeValue; }
}
const byId = {};
const document = {
  createElement: (tag) => new Node(tag),
  createElementNS: (ns, tag) => new Node(tag, ns),
  createTextNode: (t) => new TextNode(t),
  getElementById: (id) => (byId[id] = byId[id] || new Node("div")),
};
const [staticDir, answerFile, routesFile, pollsArg] = process.argv.slice(2);
const data = JSON.parse(fs.readFileSync(answerFile, "utf8"));
const routes = routesFile ? JSON.parse(fs.readFileSync(routesFile, "utf8")) : {};
const polls = Number(pollsArg || 1);
const fetched = [];
const timers = [];
const answer = (status, body) => ({ ok: status === 200, status, json: async () => body });
const context = vm.createContext({
  document, Node, console, JSON, Math, String, Object, Set, Map, Boolean, Error, Date, Array, Number,
  encodeURIComponent,
  fetch: async (url) => {
    fetched.push(url);
    if (url in routes) return answer(200, routes[url]);
    if (url.startsWith("/diagnose")) return answer(200, data);
    return answer(404, { detail: "not found" });
  },
  setTimeout: (fn) => { timers.push(fn); },
});
for (const name of ["dom.js", "app.js"]) vm.runInContext(fs.readFileSync(path.join(staticDir, name), "utf8"), context);

function findAll(node, pred, out = []) {
  if (pred(node)) out.push(node);
  for (const child of node.childNodes) findAll(child, pred, out);
  return out;
}
const hasClass = (name) => (n) => n.cls.split(/\s+/).includes(name);
const settle = () => new Promise((resolve) => setTimeout(resolve, 200));

function describeCard(card) {
  const charts = findAll(card, (n) => n.tag === "svg");
  const history = findAll(card, hasClass("history"));
  const timeline = findAll(card, hasClass("timeline"));
  const tree = findAll(card, hasClass("stack-tree"));
  const texts = (nodes) => nodes.map((n) => n.textContent).join(" ");
  return {
    charts: charts.length,
    svg_namespace: charts.map((c) => c.ns),
    paths: charts.flatMap((c) => findAll(c, (n) => n.tag === "path")).map((p) => ({ ranks: p.attrs["data-ranks"],
      d: p.attrs.d, stroke: p.attrs.stroke })),
    since_markers: charts.flatMap((c) => findAll(c, hasClass("since"))).length,
    legend: texts(findAll(card, hasClass("legend"))),
    chart_text: texts(findAll(card, hasClass("chart"))),
    history: texts(history),
    history_segments: history.flatMap((n) => findAll(n, hasClass("seg"))).map((s) => s.cls),
    timeline: timeline.flatMap((t) => findAll(t, hasClass("trow"))).map((row) => ({
      rank: row.attrs["data-rank"], cls: row.cls,
      segments: findAll(row, hasClass("seg")).map((s) => ({ cls: s.cls, style: s.attrs.style, title: s.attrs.title })),
    })),
    tree_title: texts(tree.flatMap((t) => findAll(t, (n) => n.tag === "h3"))),
    tree: tree.flatMap((t) => findAll(t, hasClass("node"))).map((row) => ({
      cls: row.cls, style: row.attrs.style, text: row.textContent,
      missing: findAll(row, hasClass("missing")).map((m) => ({ cls: m.cls, text: m.textContent })),
    })),
    links: findAll(card, (n) => n.tag === "a").map((a) => ({ href: a.attrs.href, download: a.attrs.download ?? null,
      text: a.textContent })),
    text: card.textContent,
  };
}

(async () => {
  await settle();  // the poll, the side fetches and the redraws they cause (the page's own timers are counted)
  const first = findAll(byId.jobs, () => true);
  let second = null;
  if (polls >= 2) {
    const createdBefore = created;
    timers.shift()();
    await settle();
    second = { created: created - createdBefore, kept: first.every((n) => n === byId.jobs || n.parentNode !== null) };
  }
  const cards = {};
  for (const card of findAll(byId.jobs, (n) => n.tag === "section")) cards[card.attrs.id.replace(/^job-/, "")] = describeCard(card);
  console.log(JSON.stringify({ status: byId.status.textContent, overview: byId.overview.textContent,
    jobs: byId.jobs.textContent, timers: timers.length, fetched, cards, second }));
})();
