// mopd view: the question list (filtered and paged), and each workflow's tree built when opened.
// The data is the JSON in #mopd-data (mopd/view/page_data.py): a workflow's tree is zlib'd JSON in
// base64, inflated with DecompressionStream on first open and kept.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("mopd-data").textContent);
  const W = D.workflows;   // [system, question, attempt, correct, roles, invalid roles, searches, final, step]
  const Q = D.questions;   // [dataset, id, question, gold answers]
  const NS = D.systems.length;
  const PAGE = 100;
  const LIMIT = {opd: 2, advantage: 2, teacher: 6, old: 6, sampling: 6};
  const byQ = Q.map(() => D.systems.map(() => []));
  W.forEach((w, j) => byQ[w[1]][w[0]].push(j));
  byQ.forEach(per => per.forEach(list => list.sort((a, b) => (W[a][8] || 0) - (W[b][8] || 0) || W[a][2] - W[b][2])));
  const score = byQ.map(per => per.map(list => list.length ? list.reduce((s, j) => s + W[j][3], 0) / list.length : null));
  const diff = score.map(s => (NS > 1 && s[0] !== null && s[1] !== null) ? s[0] - s[1] : 0);
  let qText = null;   // built on the first text search
  const cache = new Map();
  const state = {dataset: "", solved: "", role: "", invalid: false, nosearch: false, text: "", sort: "file",
                 page: 0, signal: D.signals[0] || "", open: -1, chosen: {}};
  let visible = [];

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }
  const $ = id => document.getElementById(id);
  // Text from records is isolated from the page's own words around it: in the document as a <bdi>
  // element, in a tooltip or a label between FSI and PDI with the record's own bidi controls
  // removed (a U+202E in an answer must not turn "not solved" right to left).
  const bdi = t => el("bdi", {text: String(t)});
  const iso = t => "\u2068" + String(t).replace(/[\u202a-\u202e\u2066-\u2069]/g, "") + "\u2069";
  const bdiJoin = (list, sep) => list.flatMap((t, k) => k ? [sep, bdi(t)] : [bdi(t)]);
  const fmt = (v, d) => (v === null || v === undefined) ? "–" : Number(v).toFixed(d === undefined ? 2 : d);

  // ---------------------------------------------------------------- filters
  function passes(j) {
    const w = W[j];
    if (state.solved === "solved" && !w[3]) return false;
    if (state.solved === "unsolved" && w[3]) return false;
    const bit = state.role ? 1 << D.roles.indexOf(state.role) : 0;
    if (bit && !(w[4] & bit)) return false;
    if (state.invalid && !(w[5] & (bit || ~0))) return false;
    if (state.nosearch && w[6] > 0) return false;
    return true;
  }
  function searchText(i) {
    const q = Q[i];
    return (q[1] + " " + q[2] + " " + q[3].join(" ") + " " + byQ[i].flat().map(j => W[j][7]).join(" ")).toLowerCase();
  }
  function applyFilters() {
    const t = state.text.trim().toLowerCase();
    if (t && qText === null) qText = Q.map((_, i) => searchText(i));
    visible = [];
    for (let i = 0; i < Q.length; i++) {
      if (state.dataset && Q[i][0] !== state.dataset) continue;
      if (t && !qText[i].includes(t)) continue;
      if (byQ[i].some(list => list.some(passes))) visible.push(i);
    }
    if (state.sort === "diff") visible.sort((a, b) => Math.abs(diff[b]) - Math.abs(diff[a]) || a - b);
    state.page = Math.min(state.page, Math.max(0, Math.ceil(visible.length / PAGE) - 1));
    renderList();
  }

  // ---------------------------------------------------------------- the list (one page at a time)
  function outcomeCell(i, s) {
    const td = el("td", {class: "outcome"});
    for (const j of byQ[i][s]) {
      const ok = W[j][3];
      td.append(el("span", {class: "att " + (passes(j) ? (ok ? "ok" : "bad") : "none"),
                            title: `attempt ${W[j][2]}${W[j][8] !== null ? " step " + W[j][8] : ""}: ` +
                                   `${ok ? "solved" : "not solved"}, answer: ${W[j][7] ? iso(W[j][7]) : "(none)"}`}));
    }
    td.append(" " + fmt(score[i][s]));
    return td;
  }
  function renderList() {
    const body = $("list-body");
    body.textContent = "";
    const start = state.page * PAGE;
    for (const i of visible.slice(start, start + PAGE)) {
      const q = Q[i];
      const tr = el("tr", {class: "qrow" + (i === state.open ? " sel" : ""), "data-q": String(i),
                           onclick: () => openQuestion(i)},
                    el("td", {}, bdi(q[0])),
                    el("td", {title: q[1]}, bdi(q[2].length > 120 ? q[2].slice(0, 120) + "…" : q[2]),
                       q[4] ? el("span", {class: "shared", title: "this id also names another question (of another " +
                                          "text) in these sources: shown apart", text: " ⚠"}) : null),
                    el("td", {}, ...bdiJoin(q[3], " | ")));
      for (let s = 0; s < NS; s++) tr.append(outcomeCell(i, s));
      if (NS > 1) tr.append(el("td", {text: fmt(diff[i])}));
      body.append(tr);
    }
    const pages = Math.max(1, Math.ceil(visible.length / PAGE));
    $("count").textContent = `${visible.length} of ${Q.length} questions · page ${state.page + 1} of ${pages}`;
    $("prev").disabled = state.page === 0;
    $("next").disabled = state.page + 1 >= pages;
  }

  // ---------------------------------------------------------------- a workflow's tree
  async function tree(j) {
    if (cache.has(j)) return cache.get(j);
    const bytes = Uint8Array.from(atob(D.trees[j]), c => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    const t = JSON.parse(await new Response(stream).text());
    cache.set(j, t);
    return t;
  }
  function colour(name, v) {
    const lim = LIMIT[name] || 2;
    if (name === "opd" || name === "advantage") {
      const a = Math.min(1, Math.abs(v) / lim) * 0.75;
      return v >= 0 ? `rgba(40,160,70,${a})` : `rgba(210,50,40,${a})`;
    }
    return `rgba(210,50,40,${Math.min(1, -v / lim) * 0.75})`;   // log-probs: redder = less likely
  }
  function output(turn, role) {
    const box = el("div", {class: "out"});
    const tk = turn.tokens;
    const vals = tk && state.signal ? tk.values[state.signal] : null;
    if (!tk || !vals || !tk.pieces.length) { box.textContent = turn.text; return box; }
    box.classList.add("tokens");
    tk.pieces.forEach((p, k) => {
      const v = vals[k] / D.scale;
      box.append(el("span", {class: "tok", "data-v": String(v), style: `background:${colour(state.signal, v)}`,
                             title: `${state.signal} ${v.toFixed(2)} (${iso(role)})`, text: p}));
    });
    return box;
  }
  function eventNode(e, said) {
    const d = el("div", {class: "event ev-" + e.kind});
    if (e.kind === "search") {
      d.append(el("span", {class: "k", text: "search: "}), bdi(e.text));
      const ol = el("ol", {class: "passages"});
      for (const p of e.passages || [])
        ol.append(el("li", {}, el("details", {}, el("summary", {text: p.title || p.id || "(untitled)"}), el("div", {text: p.text}))));
      if (!(e.passages || []).length) ol.append(el("li", {class: "meta", text: "no passages (search not run)"}));
      d.append(ol);
    } else if (e.kind === "invalid") {
      d.append(el("span", {class: "invalid"}, "invalid action: ", bdi(e.reason)));
      if (e.text !== said) d.append(el("div", {class: "out", text: e.text}));
    } else if (e.kind === "select") {
      d.append(el("span", {class: "k", text: "select: "}), "reports ", bdi((e.selection || []).join(", ")));
    } else {
      d.append(el("span", {class: "k", text: e.kind.replace("_", " ") + ": "}), bdi(e.text));
    }
    return d;
  }
  function envFold(label, text) {
    return el("details", {class: "env"}, el("summary", {text: label}), el("pre", {text}));
  }
  function turnNodes(t, call, cid, k, target) {
    for (const [, text] of t.env)
      target.append(envFold(`${k === 0 ? "input" : "environment"} (${text.length} chars)`, text));
    target.append(el("div", {class: "meta", text: `turn ${k + 1} · step ${t.step}`}));
    if (t.segment >= 0) target.append(output(t, call.role));
    for (const e of t.events) target.append(eventNode(e, t.text));
  }
  function callSummary(tr, cid) {
    const c = tr.calls[cid];
    const r = (tr.rewards || {})[cid] || {};
    const bits = [el("span", {class: "role"}, bdi(c.role), " ", bdi(cid))];
    if (c.role === "searcher" && c.parent) bits.push(" · task: ", bdi(c.parent.length > 80 ? c.parent.slice(0, 80) + "…" : c.parent));
    bits.push(el("span", {class: "meta", text: ` · in ${c.input_tokens} / out ${c.output_tokens} tokens` +
      (r.reward !== undefined && r.reward !== null ? ` · reward ${fmt(r.reward, 3)}` : "") +
      (r.advantage !== undefined && r.advantage !== null ? ` · advantage ${fmt(r.advantage, 3)}` : "") +
      (c.truncated ? " · input cut" : "")}));
    if (c.invalid) {
      const why = c.turns.flatMap(t => t.events).filter(e => e.kind === "invalid").map(e => e.reason);
      bits.push(el("span", {class: "invalid"}, " · invalid: ", ...(why.length ? bdiJoin(why, "; ") : ["yes"])));
    }
    return bits;
  }
  function promptFold(c) {
    return c.prompt >= 0 ? envFold("role prompt (folded)", D.prompts[c.prompt]) : null;
  }
  function callNode(tr, cid) {
    const c = tr.calls[cid];
    const d = el("details", {class: "node call " + c.role, "data-call": cid, open: ""},
                 el("summary", {}, ...callSummary(tr, cid)));
    d.append(promptFold(c));
    c.turns.forEach((t, k) => turnNodes(t, c, cid, k, d));
    return d;
  }
  function block(tr, b) {
    if (b.kind === "turn") {
      const c = tr.calls[b.call];
      const d = el("details", {class: "node call " + c.role, "data-call": b.call, open: ""},
                   el("summary", {}, el("span", {class: "role"}, bdi(c.role), ` turn ${b.turn + 1}`),
                      el("span", {class: "meta", text: ` · step ${b.step}`})));
      if (b.turn === 0) d.append(el("div", {}, ...callSummary(tr, b.call)), promptFold(c));
      turnNodes(c.turns[b.turn], c, b.call, b.turn, d);
      return d;
    }
    if (b.kind === "wave" || b.kind === "request") {
      const label = b.kind === "wave" ? `wave ${b.wave + 1} · ${b.calls.length} searcher(s)` :
        `answerer · ${b.calls.length} candidate(s)`;
      const d = el("details", {class: "node " + (b.kind === "wave" ? "wave" : "answerer"), open: ""},
                   el("summary", {}, el("span", {class: "role", text: label}), el("span", {class: "meta", text: ` · step ${b.step}`})));
      for (const cid of b.calls) d.append(callNode(tr, cid));
      return d;
    }
    if (b.kind === "call") return callNode(tr, b.call);
    return eventNode(b.event);
  }
  function renderTree(tr, j) {
    const box = el("div", {class: "wf", "data-wf": String(j)});
    box.append(el("div", {class: "meta"}, bdi(tr.workflow), " · ", bdi(tr.method || ""), ` · ${tr.steps} steps · ` +
      `${fmt(tr.duration, 1)} s` + (tr.step !== null && tr.step !== undefined ? ` · training step ${tr.step}` : "")));
    for (const b of tr.blocks) box.append(block(tr, b));
    box.append(el("div", {class: "final " + (tr.correct ? "ok" : "bad")}, "final answer: ",
                  tr.final === null ? "(none)" : bdi(tr.final), ` · ${tr.correct ? "solved" : "not solved"}`));
    return box;
  }

  // ---------------------------------------------------------------- the detail pane
  async function renderColumn(i, s, col) {
    const list = byQ[i][s];
    const pick = state.chosen[s] !== undefined && list.includes(state.chosen[s]) ? state.chosen[s] :
      (list.find(passes) !== undefined ? list.find(passes) : list[0]);
    col.textContent = "";
    col.append(el("h2", {}, bdi(D.systems[s].name), ` · ${fmt(score[i][s])}`));
    if (!list.length) { col.append(el("div", {class: "meta", text: "no workflow of this question"})); return; }
    const bar = el("div", {class: "attempts"});
    for (const j of list) {
      bar.append(el("button", {class: (j === pick ? "cur " : "") + (W[j][3] ? "ok-btn" : "bad-btn"), "data-wf": String(j),
        text: `${W[j][8] !== null ? "step " + W[j][8] + " · " : ""}attempt ${W[j][2]} ${W[j][3] ? "✓" : "✗"}`,
        onclick: () => { state.chosen[s] = j; renderColumn(i, s, col); }}));
    }
    col.append(bar);
    if (!D.trees[pick]) {   // left out to keep the page within --max-mb (the footer says how many)
      col.append(el("div", {class: "meta left-out", text: "this workflow's tree was left out to keep the page " +
                            "within --max-mb (see the note at the bottom of the page)"}));
      return;
    }
    const tr = await tree(pick);
    col.append(renderTree(tr, pick));
  }
  async function openQuestion(i) {
    state.open = i;
    for (const tr of document.querySelectorAll("#list-body tr.qrow"))
      tr.classList.toggle("sel", Number(tr.dataset.q) === i);
    const q = Q[i];
    const detail = $("detail");
    detail.textContent = "";
    const wrap = el("div", {style: "flex:1;min-width:0"});
    wrap.append(el("div", {class: "qhead"}, el("b", {}, bdi(q[0]), " · ", bdi(q[1]), ": "), bdi(q[2]),
                   q[4] ? el("div", {class: "shared", text: "⚠ this id also names another question (of another text) " +
                                     "in these sources; they are shown apart"}) : null,
                   el("div", {class: "meta"}, "gold: ", ...bdiJoin(q[3], " | "))));
    const cols = el("div", {style: "display:flex;gap:8px;align-items:flex-start"});
    wrap.append(cols);
    detail.append(wrap);
    const jobs = [];
    for (let s = 0; s < NS; s++) {
      const col = el("div", {class: "col", "data-system": String(s)});
      cols.append(col);
      jobs.push(renderColumn(i, s, col));
    }
    await Promise.all(jobs);
    detail.dataset.ready = String(i);
  }

  // ---------------------------------------------------------------- controls
  const decode = s => { try { return decodeURIComponent(s); } catch (e) { return s; } };   // a stray % stays
  function openFromHash() {   // #q=DATASET/ID, each part percent-encoded (the report's links); older links unencoded
    if (!location.hash.startsWith("#q=")) return;
    const raw = location.hash.slice(3);
    const cut = raw.indexOf("/");
    const ds = decode(raw.slice(0, cut)), id = decode(raw.slice(cut + 1)), whole = decode(raw);
    let i = cut >= 0 ? Q.findIndex(q => q[0] === ds && q[1] === id) : -1;
    if (i < 0) i = Q.findIndex(q => q[0] + "/" + q[1] === whole || q[0] + "/" + q[1] === raw);
    if (i >= 0) openQuestion(i);
  }
  function setup() {
    const datasets = [...new Set(Q.map(q => q[0]))].sort();
    for (const d of datasets) $("f-dataset").append(el("option", {value: d, text: d}));
    for (const r of D.roles) $("f-role").append(el("option", {value: r, text: r}));
    for (const s of D.signals) $("f-signal").append(el("option", {value: s, text: s}));
    $("f-signal").value = state.signal;
    if (NS < 2) $("f-sort").querySelector("option[value=diff]").remove();
    const on = (id, ev, f) => $(id).addEventListener(ev, f);
    on("f-dataset", "change", e => { state.dataset = e.target.value; applyFilters(); });
    on("f-solved", "change", e => { state.solved = e.target.value; applyFilters(); });
    on("f-role", "change", e => { state.role = e.target.value; applyFilters(); });
    on("f-invalid", "change", e => { state.invalid = e.target.checked; applyFilters(); });
    on("f-nosearch", "change", e => { state.nosearch = e.target.checked; applyFilters(); });
    on("f-sort", "change", e => { state.sort = e.target.value; applyFilters(); });
    let timer = null;
    on("f-text", "input", e => { clearTimeout(timer); timer = setTimeout(() => { state.text = e.target.value; applyFilters(); }, 150); });
    on("f-signal", "change", e => { state.signal = e.target.value; if (state.open >= 0) openQuestion(state.open); });
    on("prev", "click", () => { state.page--; renderList(); });
    on("next", "click", () => { state.page++; renderList(); });
    const head = $("list-head");
    for (const s of D.systems) head.append(el("th", {}, bdi(s.name)));
    if (NS > 1) head.append(el("th", {}, "Δ (", bdi(D.systems[0].name), " − ", bdi(D.systems[1].name), ")"));
    applyFilters();
    openFromHash();
    window.addEventListener("hashchange", openFromHash);
    document.body.dataset.ready = "1";
  }
  setup();
})();
