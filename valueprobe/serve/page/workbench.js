// The valueprobe workbench: a client of this server's OpenAI API (valueprobe/serve/workbench.py).
// Every model and user string reaches the page through textContent, never as markup.
"use strict";

const SCALE = 3.0; // σ at full colour: valueprobe/read/strip.py's SCALE, and the same colour()
const UP = [33, 102, 172];
const DOWN = [178, 24, 43];
const COLUMNS = ["steered", "unsteered", "random"];

function colour(value) {
  if (!Number.isFinite(value)) return "rgb(221, 221, 221)";
  const t = Math.max(-1, Math.min(1, value / SCALE));
  const end = t >= 0 ? UP : DOWN;
  const [r, g, b] = end.map((c) => Math.floor(255 + Math.abs(t) * (c - 255) + 0.5));
  return `rgb(${r}, ${g}, ${b})`;
}

const $ = (id) => document.getElementById(id);
const state = {
  card: null,
  model: null,
  randomSeed: 0,
  turns: [], // the conversation so far: {role, content}
  prompt: null, // what the columns answered: {messages} or {prompt}
  columns: {}, // name -> {body, tokens: [{text, id, value}], valueRead, steering, controller}
  timer: null,
};

function showError(message) {
  $("error").textContent = message || "";
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

// A seed is a 64-bit integer (valueprobe steer writes row seeds up to 2**62), past what a JavaScript
// number holds exactly: the page keeps it as its digits and writes them into the JSON as a number.
function stringify(value) {
  return JSON.stringify(value, (k, v) => (k === "seed" ? `@@seed${v}@@` : v)).replace(/"@@seed(\d+)@@"/g, "$1");
}

function seedDigits() {
  const digits = $("seed").value.trim();
  return /^\d{1,19}$/.test(digits) ? digits.replace(/^0+(?=\d)/, "") : "0";
}

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: stringify(body),
  };
  const response = await fetch(path, init);
  const data = await response.json();
  if (!response.ok) throw new Error(data.error ? data.error.message : `HTTP ${response.status}`);
  return data;
}

// ---- the probe card: layers, caps, units -----------------------------------------------------------

async function start() {
  const models = await api("/v1/models");
  const entry = models.data[0];
  state.model = entry.id;
  state.card = entry.valueprobe;
  const card = state.card;
  const pick = new Uint32Array(1);
  crypto.getRandomValues(pick);
  state.randomSeed = pick[0];
  $("random-name").textContent = `random-${state.randomSeed} (drawn for this session, same norm as the axis)`;
  $("about").textContent = `model ${state.model} · probe ${card.probe} · site ${card.site}`;
  const layer = $("layer");
  for (const l of card.layers) {
    const option = el("option", String(l));
    option.value = String(l);
    layer.appendChild(option);
  }
  layer.value = String(card.steering_defaults.layer);
  $("positions").value = card.steering_defaults.positions;
  const win = card.steering_defaults.window;
  if (win) { $("win-a").value = win[0]; $("win-b").value = win[1]; }
  $("op").textContent = card.steering_defaults.op;
  drawLegend();
  setCap();
  wire();
}

function unitSizes() {
  return state.card.unit_sizes[$("layer").value] || {};
}

function setCap() {
  const cap = state.card.max_alpha.by_unit.sigma[$("layer").value] || 0;
  const slider = $("alpha");
  const bound = Math.floor(cap * 10) / 10;
  slider.min = String(-bound);
  slider.max = String(bound);
  showAlpha();
}

function alpha() {
  return Number($("alpha-num").value) || 0;
}

function showAlpha() {
  const sizes = unitSizes();
  const a = alpha();
  const percent = sizes.sigma && sizes.norm ? (a * sizes.sigma) / sizes.norm : NaN;
  const cap = state.card.max_alpha.by_unit.sigma[$("layer").value];
  $("alpha-units").textContent =
    `σ = ${Number.isFinite(percent) ? percent.toFixed(1) : "?"}% of layer ${$("layer").value}'s mean norm (cap ±${cap})`;
}

function drawLegend() {
  const legend = $("legend");
  legend.appendChild(el("b", "σ scale: "));
  for (const x of [-SCALE, -SCALE / 2, 0, SCALE / 2, SCALE]) {
    const s = el("span", (x > 0 ? "+" : "") + x);
    s.style.background = colour(x);
    legend.appendChild(s);
  }
  legend.appendChild(el("span", " blue: value up, red: value down; each generated token's value is read in the forward that produced it"));
}

// ---- requests --------------------------------------------------------------------------------------

function steering(column) {
  const s = {alpha: alpha(), layer: Number($("layer").value), positions: $("positions").value};
  const a = $("win-a").value, b = $("win-b").value;
  if (a !== "" && b !== "") s.window = [Number(a), Number(b)];
  if (column === "random") s.random = state.randomSeed;
  return s;
}

function body(column) {
  const out = {
    model: state.model,
    max_tokens: Number($("max-tokens").value) || 48,
    temperature: Number($("temperature").value),
    seed: seedDigits(),
    value_layer: Number($("layer").value),
    stream: true,
    ...state.prompt,
  };
  if (column !== "unsteered") out.steering = steering(column);
  return out;
}

function route() {
  return state.prompt && state.prompt.messages ? "/v1/chat/completions" : "/v1/completions";
}

function describe(column, b) {
  if (column === "unsteered") return "α = 0";
  const s = b.steering;
  const name = column === "random" ? ` along random-${state.randomSeed}` : "";
  const win = s.window ? `, window [${s.window[0]}, ${s.window[1]})` : "";
  return `α = ${s.alpha} σ at layer ${s.layer}${name}, ${s.positions}${win}`;
}

async function run(column) {
  const previous = state.columns[column];
  if (previous && previous.controller) previous.controller.abort();
  const b = body(column);
  const controller = new AbortController();
  const col = {body: b, tokens: [], valueRead: null, steering: null, controller, done: false};
  state.columns[column] = col;
  const box = $(`col-${column}`);
  const strip = box.querySelector(".strip");
  strip.replaceChildren();
  box.querySelector(".what").textContent = describe(column, b);
  box.querySelector(".status").textContent = "generating…";
  try {
    const response = await fetch(route(), {
      method: "POST", headers: {"Content-Type": "application/json"}, body: stringify(b),
      signal: controller.signal,
    });
    if (!response.ok) {
      const data = await response.json();
      throw new Error(data.error ? data.error.message : `HTTP ${response.status}`);
    }
    await readStream(response, col, strip);
    col.done = true;
    box.querySelector(".status").textContent = `${col.tokens.length} tokens · read at ${col.valueRead ? col.valueRead.read : "?"}`;
  } catch (err) {
    if (err.name === "AbortError") return;
    box.querySelector(".status").textContent = "failed";
    showError(err.message);
  } finally {
    if (state.columns[column] === col) col.controller = null;
  }
}

async function readStream(response, col, strip) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const line = buffer.slice(0, cut).trim();
      buffer = buffer.slice(cut + 2);
      if (!line.startsWith("data: ")) continue;
      const data = line.slice(6);
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.error) throw new Error(event.error.message);
      addToken(event, col, strip);
    }
  }
}

function addToken(event, col, strip) {
  const choice = event.choices[0];
  if (!choice) return;
  if (!col.valueRead) {
    col.valueRead = event.value_read;
    col.steering = event.steering;
    $("read-point").textContent = event.value_read.read;
  }
  const text = choice.delta ? choice.delta.content || "" : choice.text || "";
  choice.values.forEach((value, k) => {
    const index = col.tokens.length;
    const id = choice.token_ids[k];
    col.tokens.push({text: k === 0 ? text : "", id, value});
    const span = el("span", k === 0 ? text : "", "tok");
    span.dataset.index = String(index);
    span.dataset.value = String(value);
    span.dataset.tokenId = String(id);
    span.style.background = colour(value);
    span.style.color = Math.abs(value) > 0.6 * SCALE ? "#fff" : "#111";
    span.title = `token ${index} (id ${id}): ${value >= 0 ? "+" : ""}${value.toFixed(3)} σ`;
    strip.appendChild(span);
  });
}

// ---- the conversation --------------------------------------------------------------------------------

function drawTurns() {
  const box = $("turns");
  box.replaceChildren();
  for (const turn of state.turns) {
    const row = el("div", undefined, "turn");
    row.appendChild(el("span", turn.role, "role"));
    row.appendChild(el("span", turn.content));
    box.appendChild(row);
  }
}

function steeredText() {
  const col = state.columns.steered;
  return col ? col.tokens.map((t) => t.text).join("") : "";
}

function send() {
  const text = $("prompt").value;
  if (!text.trim()) { showError("type a prompt first"); return; }
  showError("");
  if ($("mode-raw").checked) {
    state.turns = [];
    state.prompt = {prompt: text};
  } else {
    if (state.prompt && state.prompt.messages && state.columns.steered) {
      state.turns.push({role: "assistant", content: steeredText()}); // the conversation goes on from the steered reply
    }
    state.turns.push({role: "user", content: text});
    state.prompt = {messages: state.turns.map((t) => ({role: t.role, content: t.content}))};
  }
  drawTurns();
  $("prompt").value = "";
  COLUMNS.forEach((c) => run(c));
}

function regenerate(columns) {
  if (!state.prompt) return;
  showError("");
  columns.forEach((c) => run(c));
}

function later(columns) {
  clearTimeout(state.timer);
  state.timer = setTimeout(() => regenerate(columns), 120);
}

// ---- a click on a token: every layer, the alternatives, the logit lens --------------------------------

async function inspect(column, index, span) {
  const col = state.columns[column];
  if (!col || !col.done) return;
  document.querySelectorAll(".tok.selected").forEach((s) => s.classList.remove("selected"));
  span.classList.add("selected");
  const b = {...col.body, stream: false, token_ids: col.tokens.map((t) => t.id), index, alternatives: 8};
  delete b.stream;
  try {
    const got = await api("/v1/inspect", b);
    $("inspect").hidden = false;
    $("inspect-title").textContent =
      `${column} token ${index}: ${JSON.stringify(got.token)} (log-probability ${got.logprob.toFixed(3)})`;
    drawPlot(got.layers, got.value_read.layer);
    drawAlternatives(got);
    await showLens(got.value_read.layer);
  } catch (err) {
    showError(err.message);
  }
}

function drawPlot(layers, marked) {
  const svg = $("plot");
  svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  const w = 420, h = 220, pad = 32;
  const values = layers.map((p) => p.value);
  const lo = Math.min(0, ...values), hi = Math.max(0, ...values);
  const x = (i) => pad + (i * (w - 2 * pad)) / Math.max(1, layers.length - 1);
  const y = (v) => h - pad - ((v - lo) * (h - 2 * pad)) / Math.max(1e-9, hi - lo);
  const line = (x1, y1, x2, y2, stroke) => {
    const l = document.createElementNS(ns, "line");
    l.setAttribute("x1", x1); l.setAttribute("y1", y1); l.setAttribute("x2", x2); l.setAttribute("y2", y2);
    l.setAttribute("stroke", stroke);
    svg.appendChild(l);
  };
  const label = (tx, ty, text) => {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", tx); t.setAttribute("y", ty); t.setAttribute("font-size", "10");
    t.textContent = text;
    svg.appendChild(t);
  };
  line(pad, y(0), w - pad, y(0), "#999");
  label(2, y(0) + 3, "0");
  if (hi > 0) label(2, y(hi) + 3, hi.toFixed(1));
  if (lo < 0) label(2, y(lo) + 3, lo.toFixed(1));
  label(w / 2 - 10, h - 6, "layer");
  const path = document.createElementNS(ns, "polyline");
  path.setAttribute("points", layers.map((p, i) => `${x(i)},${y(p.value)}`).join(" "));
  path.setAttribute("fill", "none");
  path.setAttribute("stroke", "#2166ac");
  svg.appendChild(path);
  layers.forEach((p, i) => {
    const c = document.createElementNS(ns, "circle");
    c.setAttribute("cx", x(i)); c.setAttribute("cy", y(p.value));
    c.setAttribute("r", p.layer === marked ? 5 : 3);
    c.setAttribute("fill", p.layer === marked ? "#b2182b" : "#2166ac");
    c.setAttribute("class", "point");
    c.dataset.layer = String(p.layer);
    c.dataset.value = String(p.value);
    const tip = document.createElementNS(ns, "title");
    tip.textContent = `layer ${p.layer}: ${p.value.toFixed(3)} σ`;
    c.appendChild(tip);
    c.addEventListener("click", () => showLens(p.layer).catch((err) => showError(err.message)));
    svg.appendChild(c);
    if (i % 5 === 0) label(x(i) - 4, h - pad + 14, String(p.layer));
  });
}

function drawAlternatives(got) {
  const table = $("alternatives");
  table.replaceChildren();
  for (const alt of got.alternatives) {
    const row = el("tr");
    row.appendChild(el("td", JSON.stringify(alt.token)));
    row.appendChild(el("td", alt.logprob.toFixed(3)));
    if (alt.token_id === got.token_id) row.className = "chosen";
    table.appendChild(row);
  }
}

async function showLens(layer) {
  const got = await api(`/v1/logit_lens?layer=${encodeURIComponent(layer)}&k=8`);
  $("lens-caption").textContent = `logit lens of the axis at layer ${got.layer}`;
  const lens = $("lens");
  lens.replaceChildren();
  lens.appendChild(el("div", "promotes: " + got.promoted.map((p) => JSON.stringify(p[0])).join(" ")));
  lens.appendChild(el("div", "suppresses: " + got.suppressed.map((p) => JSON.stringify(p[0])).join(" ")));
}

// ---- exports ---------------------------------------------------------------------------------------------

function download(name, text, type) {
  const link = el("a", `download ${name}`);
  link.href = URL.createObjectURL(new Blob([text], {type}));
  link.download = name;
  link.id = `download-${name.replace(".", "-")}`;
  const box = $("export-links");
  const old = document.getElementById(link.id);
  if (old) old.remove();
  box.appendChild(link);
  box.appendChild(el("span", " "));
}

async function exportSpec() {
  try {
    const got = await api("/v1/spec", {steering: steering("steered"), value_layer: Number($("layer").value)});
    const text = JSON.stringify(got.spec, null, 2);
    $("exports").hidden = false;
    $("spec-out").textContent = text;
    $("command-out").textContent = `${got.command}    # α = ${got.alpha} σ`;
    download("spec.json", text + "\n", "application/json");
  } catch (err) {
    showError(err.message);
  }
}

function exportJsonl() {
  const lines = state.turns.map((t) => ({role: t.role, content: t.content}));
  for (const name of COLUMNS) {
    const col = state.columns[name];
    if (!col) continue;
    lines.push({
      role: "assistant", column: name, content: col.tokens.map((t) => t.text).join(""),
      steering: col.steering, value_read: col.valueRead, seed: col.body.seed, temperature: col.body.temperature,
      tokens: col.tokens.map((t) => t.text), token_ids: col.tokens.map((t) => t.id), values: col.tokens.map((t) => t.value),
    });
  }
  const text = lines.map((l) => stringify(l)).join("\n") + "\n";
  $("exports").hidden = false;
  $("jsonl-out").textContent = text;
  download("conversation.jsonl", text, "application/x-ndjson");
}

// ---- wiring ----------------------------------------------------------------------------------------------

function wire() {
  $("send").addEventListener("click", send);
  $("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && e.ctrlKey) send(); });
  $("clear").addEventListener("click", () => { state.turns = []; state.prompt = null; drawTurns(); });
  $("alpha").addEventListener("input", () => {
    $("alpha-num").value = $("alpha").value;
    showAlpha();
    later(["steered", "random"]);
  });
  $("alpha-num").addEventListener("change", () => {
    $("alpha").value = $("alpha-num").value;
    showAlpha();
    regenerate(["steered", "random"]);
  });
  $("layer").addEventListener("change", () => { setCap(); later(COLUMNS); });
  for (const id of ["positions", "win-a", "win-b"]) $(id).addEventListener("change", () => later(["steered", "random"]));
  for (const id of ["seed", "temperature", "max-tokens"]) $(id).addEventListener("change", () => later(COLUMNS));
  for (const name of COLUMNS) {
    $(`col-${name}`).querySelector(".strip").addEventListener("click", (e) => {
      const span = e.target.closest(".tok");
      if (span) inspect(name, Number(span.dataset.index), span);
    });
  }
  $("export-spec").addEventListener("click", exportSpec);
  $("export-jsonl").addEventListener("click", exportJsonl);
  document.body.dataset.ready = "1";
}

window.addEventListener("error", (e) => showError(String(e.message)));
document.addEventListener("DOMContentLoaded", () => start().catch((err) => showError(err.message)));
