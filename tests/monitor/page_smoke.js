// Runs monitor/static/app.js under a tiny fake DOM with a canned /diagnose answer and
// prints the text the page would show. Used by test_page.py (no browser needed).
"use strict";
const fs = require("fs");
const vm = require("vm");

class Node {
  constructor(tag) { this.tag = tag; this.children = []; this.attrs = {}; this.className = ""; this._text = null;
    this.classList = { toggle: () => {} }; }
  append(...nodes) { this.children.push(...nodes); }
  replaceChildren(...nodes) { this.children = nodes; }
  setAttribute(k, v) { this.attrs[k] = v; }
  set textContent(t) { this._text = String(t); this.children = []; }
  get textContent() { return this._text !== null ? this._text : this.children.map((c) => c.textContent).join(" "); }
}
class TextNode extends Node { constructor(t) { super("#text"); this._text = t; } }
const byId = {};
const document = {
  createElement: (tag) => new Node(tag),
  createTextNode: (t) => new TextNode(t),
  getElementById: (id) => (byId[id] = byId[id] || new Node("div")),
};
const data = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
let timers = 0;
const context = {
  document, Node, console, JSON, Math, String, Object, Set, Boolean, Error, Date,
  fetch: async () => ({ ok: true, status: 200, json: async () => data }),
  setTimeout: () => { timers += 1; },
};
vm.runInNewContext(fs.readFileSync(process.argv[2], "utf8"), context);
setImmediate(() => setImmediate(() => {
  console.log(JSON.stringify({ status: byId.status.textContent, overview: byId.overview.textContent,
                               jobs: byId.jobs.textContent, timers }));
}));
