#include "serve/web_page.h"

namespace substrate::serve {

// Element ids and data attributes are the contract with tests/serve/web (DOM assertions):
// #input, #send, #messages (.msg.assistant[data-done]), #tools-toggle, #json-toggle,
// .plot[data-samples] with ids plot-tps, plot-memory, plot-ops, plot-experts, plot-disk.
const char kWebPage[] = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>substrate</title>
<style>
  :root { --bg:#0f1115; --panel:#171a21; --line:#2a2f3a; --text:#e6e6e6; --dim:#8a93a6;
          --accent:#6aa9ff; --ok:#5fd18b; --warn:#f0b44c; --bad:#ff6b6b; }
  * { box-sizing: border-box; }
  body { margin:0; background:var(--bg); color:var(--text); font:14px/1.45 system-ui, sans-serif;
         display:grid; grid-template-columns: minmax(0, 1.4fr) minmax(320px, 1fr); height:100vh; }
  header { grid-column: 1 / -1; padding:8px 14px; border-bottom:1px solid var(--line);
           display:flex; gap:14px; align-items:center; }
  header b { color:var(--accent); }
  #status { color:var(--dim); margin-left:auto; }
  #chat { display:flex; flex-direction:column; min-height:0; border-right:1px solid var(--line); }
  #messages { flex:1; overflow:auto; padding:12px 14px; }
  .msg { margin:0 0 12px; padding:8px 10px; border-radius:8px; white-space:pre-wrap; word-break:break-word; }
  .msg.user { background:#1f2633; }
  .msg.assistant { background:var(--panel); border:1px solid var(--line); }
  .msg .thinking { color:var(--dim); font-style:italic; border-left:2px solid var(--line); padding-left:8px; margin-bottom:6px; }
  .msg .tool { font-family:ui-monospace, monospace; color:var(--warn); margin-top:6px; }
  .msg .meta { color:var(--dim); font-size:12px; margin-top:6px; }
  .msg.error { border-color:var(--bad); color:var(--bad); }
  #compose { border-top:1px solid var(--line); padding:10px 14px; display:grid; gap:8px; }
  #input { width:100%; min-height:64px; resize:vertical; background:var(--panel); color:var(--text);
           border:1px solid var(--line); border-radius:6px; padding:8px; font:inherit; }
  .row { display:flex; gap:14px; align-items:center; flex-wrap:wrap; color:var(--dim); }
  button { background:var(--accent); color:#071226; border:0; border-radius:6px; padding:7px 16px; font-weight:600; cursor:pointer; }
  button:disabled { opacity:.5; cursor:default; }
  input[type=text], input[type=number], input[type=password] { background:var(--panel); color:var(--text); border:1px solid var(--line); border-radius:4px; padding:3px 6px; }
  #engine { overflow:auto; padding:10px 14px; display:grid; gap:10px; align-content:start; }
  .plot { background:var(--panel); border:1px solid var(--line); border-radius:8px; padding:8px 10px; }
  .plot .title { display:flex; justify-content:space-between; color:var(--dim); font-size:12px; }
  .plot .value { color:var(--text); font-variant-numeric: tabular-nums; }
  .plot canvas { width:100%; height:90px; display:block; margin-top:4px; }
  .legend { display:flex; gap:10px; flex-wrap:wrap; font-size:11px; color:var(--dim); margin-top:2px; }
  .legend i { display:inline-block; width:9px; height:9px; border-radius:2px; margin-right:4px; vertical-align:middle; }
</style>
</head>
<body>
<header><b>substrate</b><span id="model">…</span><span id="status">connecting…</span></header>
<section id="chat">
  <div id="messages"></div>
  <div id="compose">
    <textarea id="input" placeholder="Message (Enter to send, Shift+Enter for a new line)"></textarea>
    <div class="row">
      <button id="send">Send</button>
      <label><input type="checkbox" id="tools-toggle"> tools</label>
      <label><input type="checkbox" id="json-toggle"> JSON mode</label>
      <label>max tokens <input type="number" id="max-tokens" value="256" min="1" style="width:70px"></label>
      <label>temperature <input type="number" id="temperature" value="0.7" step="0.1" min="0" max="2" style="width:60px"></label>
      <label>API key <input type="password" id="api-key" style="width:110px"></label>
      <button id="clear" style="background:var(--line);color:var(--text)">Clear</button>
    </div>
  </div>
</section>
<section id="engine">
  <div class="plot" id="plot-tps" data-samples="0"><div class="title">tokens / s<span class="value"></span></div><canvas></canvas><div class="legend"></div></div>
  <div class="plot" id="plot-memory" data-samples="0"><div class="title">memory ledger vs cap<span class="value"></span></div><canvas></canvas><div class="legend"></div></div>
  <div class="plot" id="plot-ops" data-samples="0"><div class="title">ops: resident vs streamed<span class="value"></span></div><canvas></canvas><div class="legend"></div></div>
  <div class="plot" id="plot-tiers" data-samples="0"><div class="title">ops by tier<span class="value"></span></div><canvas></canvas><div class="legend"></div></div>
  <div class="plot" id="plot-experts" data-samples="0"><div class="title">expert cache per interval<span class="value"></span></div><canvas></canvas><div class="legend"></div></div>
  <div class="plot" id="plot-disk" data-samples="0"><div class="title">disk per token<span class="value"></span></div><canvas></canvas><div class="legend"></div></div>
</section>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const COLORS = ["#6aa9ff", "#5fd18b", "#f0b44c", "#ff6b6b", "#c792ea", "#4dd0e1", "#ffab91", "#aed581"];
const HISTORY = 120;
const keyInput = $("api-key");
keyInput.value = localStorage.getItem("substrate-api-key") || "";
keyInput.onchange = () => localStorage.setItem("substrate-api-key", keyInput.value);
function headers() {
  const h = {"Content-Type": "application/json"};
  if (keyInput.value) h["Authorization"] = "Bearer " + keyInput.value;
  return h;
}

// Server-sent events over fetch (EventSource cannot send the API key).
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buf += decoder.decode(value, {stream: true});
    let at;
    while ((at = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, at);
      buf = buf.slice(at + 2);
      let name = "", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) onEvent(name, data);
    }
  }
}

// ---- plots ----
const series = {};  // plot id -> {name: [values]}
function push(plot, name, v) {
  const s = (series[plot] = series[plot] || {});
  const arr = (s[name] = s[name] || []);
  arr.push(Number.isFinite(v) ? v : 0);
  if (arr.length > HISTORY) arr.shift();
}
function draw(plotId, opts = {}) {
  const el = $(plotId), canvas = el.querySelector("canvas");
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const g = canvas.getContext("2d");
  g.scale(dpr, dpr);
  g.clearRect(0, 0, w, h);
  const s = series[plotId] || {};
  const names = Object.keys(s);
  let ymax = opts.ymax || 0;
  for (const n of names) for (const v of s[n]) ymax = Math.max(ymax, v);
  if (ymax <= 0) ymax = 1;
  g.strokeStyle = "#2a2f3a"; g.lineWidth = 1;
  for (let i = 1; i < 4; i++) { g.beginPath(); g.moveTo(0, h * i / 4); g.lineTo(w, h * i / 4); g.stroke(); }
  const x = (i) => w * i / (HISTORY - 1), y = (v) => h - 2 - (h - 4) * v / ymax;
  if (opts.cap) {
    g.strokeStyle = "#ff6b6b"; g.setLineDash([4, 3]);
    g.beginPath(); g.moveTo(0, y(opts.cap)); g.lineTo(w, y(opts.cap)); g.stroke(); g.setLineDash([]);
  }
  names.forEach((n, k) => {
    const vals = s[n], off = HISTORY - vals.length;
    g.strokeStyle = COLORS[k % COLORS.length]; g.lineWidth = 1.6;
    g.beginPath();
    vals.forEach((v, i) => (i ? g.lineTo(x(off + i), y(v)) : g.moveTo(x(off + i), y(v))));
    g.stroke();
  });
  el.querySelector(".legend").innerHTML = names.map((n, k) =>
    `<span><i style="background:${COLORS[k % COLORS.length]}"></i>${n}</span>`).join("") +
    (opts.cap ? `<span><i style="background:#ff6b6b"></i>cap</span>` : "");
  const samples = names.length ? s[names[0]].length : 0;
  el.dataset.samples = String(Number(el.dataset.samples) + 1);
  el.dataset.series = names.join(",");
  if (opts.value !== undefined) el.querySelector(".value").textContent = opts.value;
  return samples;
}
const mib = (b) => (b / 1048576).toFixed(1) + " MiB";

let last = null;
function onStats(st) {
  $("model").textContent = st.model;
  $("status").textContent = `${st.slots_busy}/${st.slots} slots busy · ${st.queued} queued`;
  push("plot-tps", "tokens/s", st.tokens_per_second);
  draw("plot-tps", {value: st.tokens_per_second.toFixed(1)});

  const acc = st.memory.accounts || {};
  for (const [name, bytes] of Object.entries(acc)) push("plot-memory", name, bytes / 1048576);
  push("plot-memory", "total", st.memory.current / 1048576);
  draw("plot-memory", {cap: st.memory.cap ? st.memory.cap / 1048576 : 0,
                       value: mib(st.memory.current) + (st.memory.cap ? " / " + mib(st.memory.cap) : " (no cap)")});

  const rt = st.runtime || {}, ops = rt.ops || {}, ec = rt.expert_cache || {}, disk = rt.disk || {};
  push("plot-ops", "resident", ops.resident || 0);
  push("plot-ops", "streamed", ops.streamed || 0);
  draw("plot-ops", {value: `${ops.resident || 0} resident · ${ops.streamed || 0} streamed`});

  // Each op's tier now (counted by tier), and the adaptive runtime's escalated ops.
  for (const [tier, n] of Object.entries(rt.op_tiers || {})) push("plot-tiers", "tier " + tier, n);
  const ad = rt.adaptive;
  const esc = ad ? ad.escalated.map((e) => `${e.op}→${e.tier}`).join(", ") : "";
  draw("plot-tiers", {value: ad ? `${ad.escalations} escalations` + (esc ? ` · now ${esc}` : "")
                                : "not adaptive"});

  const gen = st.tokens.generated;
  if (last) {
    const dt = Math.max(1, gen - last.tokens.generated);
    const lrt = last.runtime || {}, lec = lrt.expert_cache || {}, ld = lrt.disk || {};
    push("plot-experts", "hits", (ec.hits || 0) - (lec.hits || 0));
    push("plot-experts", "misses", (ec.misses || 0) - (lec.misses || 0));
    const hit = (ec.hits || 0) + (ec.misses || 0) ? (100 * ec.hits / (ec.hits + ec.misses)).toFixed(0) + "% hits" : "no experts";
    draw("plot-experts", {value: hit});
    const mbPerTok = ((disk.bytes_read || 0) - (ld.bytes_read || 0)) / 1048576 / dt;
    const stallPerTok = ((disk.stall_us || 0) - (ld.stall_us || 0)) / 1000 / dt;
    push("plot-disk", "MiB read / token", mbPerTok);
    push("plot-disk", "stall ms / token", stallPerTok);
    draw("plot-disk", {value: `${mbPerTok.toFixed(2)} MiB · ${stallPerTok.toFixed(2)} ms`});
  }
  last = st;
}

async function watchEngine() {
  for (;;) {
    try {
      const r = await fetch("/v1/runtime/events?interval_ms=500", {headers: headers()});
      if (!r.ok) throw new Error("HTTP " + r.status);
      await readEvents(r, (name, data) => { if (name === "stats") onStats(JSON.parse(data)); });
    } catch (e) {
      $("status").textContent = "engine view: " + e.message;
    }
    await new Promise((ok) => setTimeout(ok, 1000));
  }
}

// ---- chat ----
const convo = [];
const TOOLS = [{type: "function", function: {name: "get_weather", description: "Current weather in a city",
  parameters: {type: "object", properties: {city: {type: "string", maxLength: 40},
  unit: {enum: ["celsius", "fahrenheit"]}}, required: ["city"], additionalProperties: false}}}];

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text || "";
  $("messages").appendChild(div);
  $("messages").scrollTop = 1e9;
  return div;
}

async function send() {
  const text = $("input").value.trim();
  if (!text) return;
  $("input").value = "";
  $("send").disabled = true;
  convo.push({role: "user", content: text});
  addMessage("user", text);
  const div = addMessage("assistant", "");
  div.dataset.done = "false";
  const thinking = document.createElement("div"), body = document.createElement("div"), meta = document.createElement("div");
  thinking.className = "thinking"; body.className = "content"; meta.className = "meta";
  div.append(thinking, body, meta);
  const req = {messages: convo, stream: true, stream_options: {include_usage: true},
               max_tokens: Number($("max-tokens").value) || 256,
               temperature: Number($("temperature").value)};
  if ($("tools-toggle").checked) req.tools = TOOLS;
  if ($("json-toggle").checked) req.response_format = {type: "json_object"};
  let content = "", reasoning = "";
  const calls = [];
  const t0 = performance.now();
  try {
    const r = await fetch("/v1/chat/completions", {method: "POST", headers: headers(), body: JSON.stringify(req)});
    if (!r.ok) throw new Error((await r.json()).error.message);
    await readEvents(r, (name, data) => {
      if (data === "[DONE]") return;
      const d = JSON.parse(data);
      if (d.error) throw new Error(d.error.message);
      if (d.usage) meta.textContent = `${d.usage.completion_tokens} tokens · ${d.usage.prompt_tokens} prompt (${d.usage.prompt_tokens_details.cached_tokens} cached) · ${((performance.now() - t0) / 1000).toFixed(1)} s`;
      for (const c of d.choices || []) {
        const delta = c.delta || {};
        if (delta.reasoning_content) { reasoning += delta.reasoning_content; thinking.textContent = reasoning; }
        if (delta.content) { content += delta.content; body.textContent = content; }
        for (const tc of delta.tool_calls || []) {
          const call = (calls[tc.index] = calls[tc.index] || {id: tc.id, name: "", arguments: ""});
          if (tc.function && tc.function.name) call.name = tc.function.name;
          if (tc.function && tc.function.arguments) call.arguments += tc.function.arguments;
        }
        if (calls.length) {
          let tools = div.querySelector(".tool");
          if (!tools) { tools = document.createElement("div"); tools.className = "tool"; div.insertBefore(tools, meta); }
          tools.textContent = calls.map((c) => `→ ${c.name}(${c.arguments})`).join("\n");
        }
      }
      $("messages").scrollTop = 1e9;
    });
    const msg = {role: "assistant", content};
    if (calls.length) msg.tool_calls = calls.map((c) => ({id: c.id, type: "function", function: {name: c.name, arguments: c.arguments}}));
    convo.push(msg);
  } catch (e) {
    div.classList.add("error");
    body.textContent = content + "\n[" + e.message + "]";
    convo.pop();
  }
  div.dataset.done = "true";
  $("send").disabled = false;
}

$("send").onclick = send;
$("input").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); } });
$("clear").onclick = () => { convo.length = 0; $("messages").innerHTML = ""; };
watchEngine();
</script>
</body>
</html>
)HTML";

}  // namespace substrate::serve
