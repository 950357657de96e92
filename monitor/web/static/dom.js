// Update the page in place. app.js describes what a part of the page should hold with el()/svg()
// (plain objects, no DOM), and patch() brings the live DOM there touching only what differs:
// an element whose key, tag and attributes stay is kept, a text node whose text stays is kept.
// So a poll every 2 s leaves a text selection, an open tooltip and the scroll position alone.
// Text goes in as text nodes, never innerHTML: strings come from the monitored processes.
"use strict";

// The SVG namespace is a name, not an address: nothing is fetched from it.
const SVG_NS = "http://www.w3.org/2000/svg";

// attrs.key (not an attribute) names an element among its siblings; without one, elements are
// matched by tag, class and order among the siblings of that tag and class.
function el(tag, attrs, ...children) {
  return vnode(null, tag, attrs, children);
}

function svg(tag, attrs, ...children) {
  return vnode(SVG_NS, tag, attrs, children);
}

function vnode(ns, tag, attrs, children) {
  const { key, ...rest } = attrs || {};
  const kids = [];
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    kids.push(typeof child === "object" ? child : String(child));
  }
  return { ns, tag, key: key === undefined ? null : String(key), attrs: rest, children: kids };
}

function keysOf(vnodes) {
  const seen = new Map();
  return vnodes.map((v) => {
    if (typeof v === "string") return nth(seen, "#text");
    return v.key !== null ? `key:${v.key}` : nth(seen, `${v.ns || ""}|${v.tag}.${v.attrs.class || ""}`);
  });
}

function nth(seen, base) {
  const n = seen.get(base) || 0;
  seen.set(base, n + 1);
  return `${base}#${n}`;
}

function sameKind(node, v) {
  if (typeof v === "string") return node.nodeType === 3;
  return node.nodeType === 1 && node.__hwTag === `${v.ns || ""}|${v.tag}`;
}

// Make parent's children match vnodes, reusing the children whose key and kind match.
function patch(parent, vnodes) {
  const keys = keysOf(vnodes);
  const old = new Map();
  for (const child of Array.from(parent.childNodes)) {
    if (child.__hwKey !== undefined && !old.has(child.__hwKey)) old.set(child.__hwKey, child);
    else parent.removeChild(child);  // not ours (the initial <noscript>) or a duplicate
  }
  const wanted = vnodes.map((v, i) => {
    const found = old.get(keys[i]);
    if (found && sameKind(found, v)) {
      old.delete(keys[i]);
      update(found, v);
      return found;
    }
    const made = create(v);
    made.__hwKey = keys[i];
    return made;
  });
  for (const gone of old.values()) parent.removeChild(gone);
  wanted.forEach((node, i) => {
    // Only out-of-place nodes move: moving a node would drop a selection inside it.
    if (parent.childNodes[i] !== node) parent.insertBefore(node, parent.childNodes[i] || null);
  });
}

function create(v) {
  if (typeof v === "string") return document.createTextNode(v);
  const node = v.ns ? document.createElementNS(v.ns, v.tag) : document.createElement(v.tag);
  node.__hwTag = `${v.ns || ""}|${v.tag}`;
  node.__hwAttrs = {};
  update(node, v);
  return node;
}

function update(node, v) {
  if (typeof v === "string") {
    if (node.nodeValue !== v) node.nodeValue = v;
    return;
  }
  const before = node.__hwAttrs;
  for (const [name, value] of Object.entries(v.attrs)) {
    const text = String(value);
    if (before[name] !== text) node.setAttribute(name, text);
  }
  for (const name of Object.keys(before)) if (!(name in v.attrs)) node.removeAttribute(name);
  node.__hwAttrs = Object.fromEntries(Object.entries(v.attrs).map(([k, value]) => [k, String(value)]));
  patch(node, v.children);
}
