// engram-viz gate view: the front end of engram_viz.apps.gate_view.GateView (an anywidget ES module).
// Plain JavaScript, no imports: it runs wherever anywidget runs (JupyterLab, Notebook, VS Code, Colab,
// marimo) and on the `engram-viz app` page, offline. The kernel sends data (panels, explanation,
// ablation, exported files); everything here is drawing and turning clicks into requests.

const REDUCTIONS = ["mean", "max", "min"];

function hexToRgb(hex) {
  const n = parseInt(hex.slice(1), 16);
  return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
}

// a colour from evenly spaced hex stops at v in 0..1
function colourAt(stops, v) {
  const x = Math.min(1, Math.max(0, Number.isFinite(v) ? v : 0)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  const a = hexToRgb(stops[i]);
  const b = hexToRgb(stops[i + 1]);
  const c = a.map((ai, k) => Math.round(ai + (b[k] - ai) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// WCAG relative luminance of 0..255 channels
function luminance(r, g, b) {
  const lin = [r, g, b].map((c) => {
    const s = c / 255;
    return s <= 0.04045 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
  });
  return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
}

function textOn(rgb) {
  const [r, g, b] = rgb.match(/\d+/g).map(Number);
  return luminance(r, g, b) > 0.22 ? "#111111" : "#f5f5f5";
}

// one value from a token's hc gates: one stream, or the mean / max / min over streams
function reduce(values, stream) {
  if (!REDUCTIONS.includes(stream)) return values[Number(stream)];
  if (stream === "max") return Math.max(...values);
  if (stream === "min") return Math.min(...values);
  return values.reduce((s, v) => s + v, 0) / values.length;
}

function streamText(stream) {
  return REDUCTIONS.includes(stream) ? `${stream} of streams` : `stream ${stream}`;
}

// 'light' or 'dark': JupyterLab's flag, a theme class on the page (marimo, VS Code), else the
// background behind the view, else the system preference
function hostTheme(el) {
  const body = document.body;
  if (body && body.dataset.jpThemeLight !== undefined) return body.dataset.jpThemeLight === "false" ? "dark" : "light";
  const classes = `${document.documentElement.className} ${body ? body.className : ""}`;
  if (/\b(dark|dark-theme|vscode-dark|vscode-high-contrast)\b/.test(classes)) return "dark";
  if (/\b(light|light-theme|vscode-light)\b/.test(classes)) return "light";
  let node = el;
  while (node) {
    if (node.nodeType === 1) {
      const m = getComputedStyle(node).backgroundColor.match(/rgba?\(([^)]+)\)/);
      if (m) {
        const [r, g, b, a = 1] = m[1].split(",").map(Number);
        if (a > 0.5) return luminance(r, g, b) < 0.2 ? "dark" : "light";
      }
    }
    node = node.parentElement || (node.getRootNode && node.getRootNode().host) || null;
  }
  return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

const SKELETON = `
<div class="ev-header"></div>
<div class="ev-prompts"></div>
<div class="ev-controls">
  <label>layer <select class="ev-layer"></select></label>
  <label>stream <select class="ev-stream"></select></label>
  <span class="ev-viewmode"><button data-view="tokens">tokens</button><button data-view="all gates">all gates</button></span>
  <label>theme <select class="ev-theme"><option>auto</option><option>light</option><option>dark</option></select></label>
  <button class="ev-add" title="add a prompt, compared with A">+ prompt</button>
</div>
<div class="ev-controls">
  <label>image <input class="ev-image-spec" size="9" placeholder="WxH or WxHpx"></label>
  <label>into <select class="ev-image-into"></select></label>
  <button class="ev-image-insert" title="append an &lt;image:WxH&gt; placeholder">insert image</button>
  <label class="ev-picture" title="append a real picture (PNG or JPEG) to the prompt chosen under 'into'">picture <input type="file" class="ev-picture-file" accept="image/png,image/jpeg"></label>
  <span class="ev-image-info ev-muted"></span>
  <span class="ev-spacer"></span>
  <label>export <select class="ev-export-format"><option>html</option><option>png</option><option>pdf</option><option>json</option></select></label>
  <button class="ev-export-button" title="save this view (json: its settings)">export</button>
  <span class="ev-export-info ev-muted"></span>
</div>
<div class="ev-status ev-muted"></div>
<div class="ev-panels"></div>
<div class="ev-diffs"></div>
<div class="ev-explain"></div>
<div class="ev-tip" hidden></div>`;

function render({ model, el }) {
  const root = h("div", { class: "ev-view" });
  root.innerHTML = SKELETON;
  el.appendChild(root);
  const $ = (sel) => root.querySelector(sel);
  const active = () => root.getRootNode().activeElement; // the focused element, inside a shadow root too
  const tip = $(".ev-tip");
  const sent = {}; // prompt index -> text this view last sent
  let timer = null;
  let scheduled = false;

  const set = (name, value) => {
    model.set(name, value);
    model.save_changes();
  };
  const theme = () => {
    const t = model.get("theme");
    return t === "auto" ? model.get("host_theme") : t;
  };
  const colours = () => (model.get("themes") || {})[theme()] || { heat: ["#000000", "#ffffff"], token: ["#ffffff", "#000000"] };

  function applyTheme() {
    const t = colours();
    const follow = model.get("theme") === "auto";
    const host = (v, fallback) => (follow ? `var(${v}, ${fallback})` : fallback);
    root.dataset.theme = theme();
    root.style.setProperty("--ev-fg", host("--jp-ui-font-color1", t.foreground));
    root.style.setProperty("--ev-bg", host("--jp-layout-color0", t.background));
    root.style.setProperty("--ev-muted", host("--jp-ui-font-color2", t.muted));
    root.style.setProperty("--ev-panel", host("--jp-layout-color1", t.panel));
    root.style.setProperty("--ev-border", host("--jp-border-color1", t.border));
    root.style.setProperty("--ev-image", t.image);
    root.style.setProperty("--ev-positive", t.positive);
    root.style.setProperty("--ev-negative", t.negative);
    root.style.setProperty("--ev-warn", t.warn);
  }

  function checkHost() {
    const found = hostTheme(el);
    if (found !== model.get("host_theme")) set("host_theme", found);
  }

  // ---------------------------------------------------------------- controls
  function drawControls() {
    const layers = model.get("layer_ids");
    const layerSel = $(".ev-layer");
    if (layerSel.options.length !== layers.length) {
      layerSel.replaceChildren(...layers.map((l) => h("option", { value: l, text: String(l) })));
    }
    layerSel.value = String(model.get("layer"));
    const streams = [...REDUCTIONS, ...Array.from({ length: model.get("hc") }, (_, s) => String(s))];
    const streamSel = $(".ev-stream");
    if (streamSel.options.length !== streams.length) {
      streamSel.replaceChildren(
        ...streams.map((s) => h("option", { value: s, text: REDUCTIONS.includes(s) ? s : `stream ${s}` })),
      );
    }
    streamSel.value = model.get("stream");
    $(".ev-theme").value = model.get("theme");
    for (const b of root.querySelectorAll(".ev-viewmode button")) {
      b.classList.toggle("ev-on", b.dataset.view === model.get("view"));
    }
    const prompts = model.get("prompts");
    const slots = prompts.map((_, k) => String.fromCharCode(65 + k));
    const into = $(".ev-image-into");
    const keep = into.value || "A";
    into.replaceChildren(...slots.map((s) => h("option", { value: s, text: s })));
    into.value = slots.includes(keep) ? keep : "A";
    const spec = $(".ev-image-spec");
    if (active() !== spec && spec.value !== model.get("image_spec")) spec.value = model.get("image_spec");
    $(".ev-image-info").textContent = model.get("image_info");
    $(".ev-add").disabled = prompts.length >= model.get("max_prompts");
    for (const n of root.querySelectorAll(".ev-controls")) n.hidden = !model.get("editable");
    drawPrompts(prompts);
  }

  function drawPrompts(prompts) {
    const box = $(".ev-prompts");
    box.hidden = !model.get("editable");
    while (box.children.length > prompts.length) box.lastChild.remove();
    prompts.forEach((text, k) => {
      let ta = box.children[k] && box.children[k].querySelector("textarea");
      if (!ta) {
        const slot = String.fromCharCode(65 + k);
        ta = h("textarea", { rows: 3, placeholder: `prompt ${slot}: text, with <image:WxH> placeholders if you like` });
        ta.addEventListener("input", () => schedulePrompts());
        box.append(h("label", { class: "ev-prompt" }, h("span", { class: "ev-slot", text: slot }), ta));
      }
      // the kernel's text wins unless this box is being typed into and still holds what it sent
      const typing = active() === ta && ta.value !== sent[k];
      if (ta.value !== text && !typing) ta.value = text;
    });
  }

  function sendPrompts() {
    const values = [...root.querySelectorAll(".ev-prompts textarea")].map((t) => t.value);
    values.forEach((v, k) => (sent[k] = v));
    set("prompts", values);
  }

  function schedulePrompts() {
    clearTimeout(timer);
    timer = setTimeout(sendPrompts, 250);
  }

  // ---------------------------------------------------------------- prompt panels
  function tokenTitle(panel, pos) {
    const note = (panel.notes || {})[String(pos)];
    return `${panel.labels[pos]} · position ${pos}${note ? ` · ${note}` : ""}`;
  }

  function gatesOf(panel, pos) {
    const L = panel.layer_ids.length;
    const S = panel.hc;
    const out = [];
    for (let li = 0; li < L; li++) out.push(panel.gates.slice((pos * L + li) * S, (pos * L + li + 1) * S));
    return out;
  }

  function rowsOf(panel, pos, li) {
    const L = panel.layer_ids.length;
    const C = panel.n_cols;
    return panel.rows.slice((pos * L + li) * C, (pos * L + li + 1) * C);
  }

  function drawPanel(panel) {
    const slot = panel.slot;
    const layer = model.get("layer");
    const stream = model.get("stream");
    const allGates = model.get("view") === "all gates";
    const what = allGates ? "all gates (rows: layers, columns: streams)" : `layer ${layer} · ${streamText(stream)}`;
    const div = h("div", { class: "ev-panel", "data-slot": slot }, h("div", { class: "ev-title", text: `prompt ${slot} · ${what}` }));
    if (panel.error) {
      div.append(h("div", { class: "ev-message", text: panel.error }));
      return div;
    }
    const li = panel.layer_ids.indexOf(layer);
    const c = colours();
    const sel = model.get("selected") || {};
    const text = h("div", { class: allGates ? "ev-text ev-grid-text" : "ev-text" });
    for (let pos = 0; pos < panel.n; ) {
      if (panel.image[pos]) {
        let end = pos;
        while (end < panel.n && panel.image[end]) end++;
        text.append(h("span", { class: "ev-img", "data-pos": pos, title: `image span: positions ${pos}..${end - 1} (gates shut)`, text: `[image ×${end - pos}]` }));
        pos = end;
        continue;
      }
      const gates = gatesOf(panel, pos);
      const chosen = sel.slot === slot && sel.position === pos;
      if (allGates) {
        const grid = h("span", { class: "ev-grid", style: `grid-template-columns: repeat(${panel.hc}, 12px)` });
        gates.forEach((row, l) =>
          row.forEach((g, s) => grid.append(h("span", { class: "ev-gcell", "data-layer": panel.layer_ids[l], "data-stream": s, style: `background:${colourAt(c.heat, g)}` }))),
        );
        text.append(h("span", { class: `ev-tok ev-cell${chosen ? " ev-selected" : ""}`, "data-pos": pos }, h("span", { class: "ev-label", text: panel.labels[pos] }), grid));
      } else {
        const bg = colourAt(c.token, reduce(gates[li], stream));
        text.append(h("span", { class: `ev-tok${chosen ? " ev-selected" : ""}`, "data-pos": pos, style: `background:${bg};color:${textOn(bg)}`, text: panel.labels[pos] }));
      }
      pos++;
    }
    div.append(text);
    const ramp = allGates ? c.heat : c.token;
    div.append(h("div", { class: "ev-legend ev-muted" }, "gate 0 ", h("span", { class: "ev-ramp", style: `background:linear-gradient(to right, ${ramp.join(",")})` }), " 1 · click a token to explain it, hover for its gates and rows"));
    return div;
  }

  function showTip(event, panel, pos, cell) {
    const layer = model.get("layer");
    const li = panel.layer_ids.indexOf(layer);
    const gates = gatesOf(panel, pos);
    const rows = rowsOf(panel, pos, li);
    const table = h("table", {}, h("tr", {}, h("th", { text: "layer" }), ...gates[0].map((_, s) => h("th", { text: `s${s}` }))));
    gates.forEach((row, l) => {
      const tr = h("tr", {}, h("td", { text: String(panel.layer_ids[l]) }));
      row.forEach((g, s) => {
        const hit = cell && Number(cell.dataset.layer) === panel.layer_ids[l] && Number(cell.dataset.stream) === s;
        tr.append(h("td", { class: hit ? "ev-hit" : "", text: g.toFixed(3) }));
      });
      table.append(tr);
    });
    const ids = [];
    for (let k = 0; k < rows.length; k += 6) ids.push(rows.slice(k, k + 6).join("  "));
    tip.replaceChildren(
      h("div", { class: "ev-tip-title", text: tokenTitle(panel, pos) }),
      table,
      h("div", { class: "ev-muted", text: `row ids at layer ${layer} (columns 0..${rows.length - 1}):` }),
      h("pre", { text: ids.join("\n") }),
    );
    tip.hidden = false;
    const x = Math.min(event.clientX + 14, window.innerWidth - 450);
    tip.style.left = `${Math.max(0, x)}px`;
    tip.style.top = `${event.clientY + 16}px`;
  }

  // ---------------------------------------------------------------- explanation and ablation
  function drawExplanation() {
    const box = $(".ev-explain");
    const ex = model.get("explanation") || {};
    const layer = model.get("layer");
    const stream = model.get("stream");
    if (!ex.layers || !ex.layers[String(layer)]) {
      box.replaceChildren(h("div", { class: "ev-muted", text: "click a token of a prompt to see its 24 rows, decoded n-grams and shares" }));
      return;
    }
    const at = ex.layers[String(layer)];
    const ab = model.get("ablation") || {};
    const pending = model.get("ablate_request") || {};
    const scale = Math.max(1e-9, ...at.rows.map((r) => Math.abs(reduce(r.share, stream))));
    const head = h("tr", {}, ...["col", "n-gram", "owner", "row", "share of dot", "gate without", "ablate", ""].map((t) => h("th", { text: t })));
    const table = h("table", { class: "ev-rows" }, head);
    for (const r of at.rows) {
      const share = reduce(r.share, stream);
      const bar = h("span", { class: "ev-bar", style: `width:${Math.round((60 * Math.abs(share)) / scale)}px;background:var(${share < 0 ? "--ev-negative" : "--ev-positive"})` });
      const mine = ab.column === r.column && ab.layer === layer && ab.slot === ex.slot && ab.position === ex.position;
      const waiting = !mine && pending.column === r.column && pending.nonce && pending.nonce !== ab.nonce && !pending.restore;
      const button = h("button", { class: "ev-ablate", "data-column": r.column, text: waiting ? "ablating…" : "ablate", disabled: waiting });
      button.addEventListener("click", () => {
        set("ablate_request", { slot: ex.slot, position: ex.position, layer, column: r.column, nonce: `${Date.now()}-${r.column}` });
      });
      let result = "";
      if (mine) {
        const before = reduce(ab.before, stream);
        const after = reduce(ab.after, stream);
        const d = after - before;
        result = `gate ${before.toFixed(3)} → ${after.toFixed(3)} (${d >= 0 ? "+" : "−"}${Math.abs(d).toFixed(3)}); ${ab.changed} ${ab.changed === 1 ? "token" : "tokens"} changed`;
      }
      table.append(
        h("tr", { class: mine ? "ev-row ev-ablated" : "ev-row", "data-column": r.column },
          h("td", { text: String(r.column) }),
          h("td", { class: "ev-ngram", text: JSON.stringify(r.ngram) }),
          h("td", { text: `${r.order}-gram h${r.head}` }),
          h("td", { text: String(r.row) }),
          h("td", {}, `${share >= 0 ? "+" : "−"}${Math.abs(100 * share).toFixed(1)}% `, bar),
          h("td", { text: reduce(r.loo_gate, stream).toFixed(4) }),
          h("td", {}, button),
          h("td", { class: "ev-ablation-result", text: result })));
    }
    const title = `${JSON.stringify(ex.token)} at position ${ex.position} of prompt ${ex.slot}, layer ${layer} (${streamText(stream)}): gate ${reduce(at.gate, stream).toFixed(4)}`;
    const parts = [
      h("div", { class: "ev-title", text: `the 24 rows of position ${ex.position}` }),
      h("div", { class: "ev-subtitle", text: title }),
      table,
      h("div", { class: "ev-muted ev-note", text: "n-grams are decoded from the compressed vocabulary the hash reads, which folds case and spacing variants into one id, so they show lower-cased. A row's share is its part of the gate's dot product (signed); 'gate without' leaves that row out." }),
    ];
    if (ab.html && ab.slot === ex.slot && ab.position === ex.position) {
      const diff = h("div", { class: "ev-diff ev-ablation-diff" });
      diff.innerHTML = ab.html; // built by the kernel from escaped templates
      const restore = h("button", { class: "ev-restore", text: "restore" });
      restore.addEventListener("click", () => set("ablate_request", { restore: true, nonce: `${Date.now()}-restore` }));
      parts.push(h("div", { class: "ev-controls" }, restore), diff);
    }
    box.replaceChildren(h("div", { class: "ev-panel ev-explainer" }, ...parts));
  }

  // ---------------------------------------------------------------- drawing everything
  function draw() {
    scheduled = false;
    applyTheme();
    drawControls();
    const hd = model.get("header") || {};
    $(".ev-header").textContent = hd.model ? `Model and weights: ${hd.model} · ${hd.streams} · ${hd.config} · layers ${model.get("layer_ids").join(", ")} · ${hd.device}` : "";
    $(".ev-status").textContent = model.get("busy") ? "working…" : model.get("status");
    const panels = model.get("panels") || [];
    const row = h("div", { class: "ev-panel-row" });
    for (const p of panels) row.append(drawPanel(p));
    $(".ev-panels").replaceChildren(row);
    const diffs = model.get("diffs") || {};
    $(".ev-diffs").replaceChildren(
      ...Object.entries(diffs).map(([key, html]) => {
        const d = h("div", { class: "ev-diff", "data-key": key });
        d.innerHTML = html; // built by the kernel from escaped templates
        return d;
      }),
    );
    drawExplanation();
  }

  function schedule() {
    if (!scheduled) {
      scheduled = true;
      requestAnimationFrame(draw);
    }
  }

  // ---------------------------------------------------------------- events
  const panelOf = (node) => {
    const div = node.closest(".ev-panel[data-slot]");
    return div ? (model.get("panels") || []).find((p) => p.slot === div.dataset.slot) : null;
  };
  root.addEventListener("click", (event) => {
    const tok = event.target.closest(".ev-panels .ev-tok");
    if (tok) {
      const panel = panelOf(tok);
      if (panel) set("selected", { slot: panel.slot, position: Number(tok.dataset.pos) });
      return;
    }
    const mode = event.target.closest(".ev-viewmode button");
    if (mode) set("view", mode.dataset.view);
  });
  root.addEventListener("mousemove", (event) => {
    const tok = event.target.closest(".ev-panels .ev-tok");
    const panel = tok && panelOf(tok);
    if (!panel) {
      tip.hidden = true;
      return;
    }
    showTip(event, panel, Number(tok.dataset.pos), event.target.closest(".ev-gcell"));
  });
  root.addEventListener("mouseleave", () => (tip.hidden = true));
  $(".ev-layer").addEventListener("change", (e) => set("layer", Number(e.target.value)));
  $(".ev-stream").addEventListener("change", (e) => set("stream", e.target.value));
  $(".ev-theme").addEventListener("change", (e) => set("theme", e.target.value));
  $(".ev-add").addEventListener("click", () => set("prompts", [...model.get("prompts"), ""]));
  $(".ev-image-spec").addEventListener("input", (e) => set("image_spec", e.target.value));
  $(".ev-image-insert").addEventListener("click", () => {
    const k = $(".ev-image-into").value.charCodeAt(0) - 65;
    const prompts = [...model.get("prompts")];
    const spec = $(".ev-image-spec").value.trim().replace(/^<image:/, "").replace(/>$/, "");
    const sep = !prompts[k] || /[ \n]$/.test(prompts[k]) ? "" : " ";
    prompts[k] = `${prompts[k]}${sep}<image:${spec}> `;
    set("prompts", prompts);
  });
  $(".ev-picture-file").addEventListener("change", async (e) => {
    const file = e.target.files[0];
    e.target.value = ""; // the same file can be chosen again
    if (!file) return;
    const slot = $(".ev-image-into").value || "A";
    const most = model.get("max_upload_bytes");
    if (most && file.size > most) {
      set("image_info", `upload '${file.name}' has ${file.size.toLocaleString("en")} bytes; at most ${most.toLocaleString("en")} are taken`);
      return;
    }
    const bytes = new Uint8Array(await file.arrayBuffer());
    let binary = "";
    for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    set("picture_upload", { slot, name: file.name, data: btoa(binary), nonce: `${Date.now()}` });
  });
  $(".ev-export-button").addEventListener("click", () => {
    $(".ev-export-info").textContent = "exporting…";
    set("export_request", { format: $(".ev-export-format").value, nonce: `${Date.now()}` });
  });
  model.on("change:export_file", () => {
    const f = model.get("export_file") || {};
    const asked = (model.get("export_request") || {}).nonce;
    if (!f.nonce || f.nonce !== asked) return;
    if (f.error) {
      $(".ev-export-info").textContent = f.error;
      return;
    }
    const bytes = Uint8Array.from(atob(f.data), (ch) => ch.charCodeAt(0));
    const url = URL.createObjectURL(new Blob([bytes], { type: f.mime }));
    const a = h("a", { href: url, download: f.name, class: "ev-download", hidden: true });
    root.append(a);
    a.click();
    $(".ev-export-info").textContent = `saved ${f.name} (${bytes.length.toLocaleString()} bytes)`;
    setTimeout(() => {
      URL.revokeObjectURL(url);
      a.remove();
    }, 60000);
  });

  const names = ["prompts", "layer", "stream", "view", "theme", "host_theme", "themes", "header", "panels", "diffs", "status", "busy", "selected", "explanation", "ablation", "ablate_request", "image_info", "image_spec", "editable"];
  for (const n of names) model.on(`change:${n}`, schedule);
  const watch = new MutationObserver(checkHost);
  for (const node of [document.documentElement, document.body]) {
    if (node) watch.observe(node, { attributes: true, attributeFilter: ["class", "data-jp-theme-light", "data-theme", "style"] });
  }
  const media = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;
  if (media) media.addEventListener("change", checkHost);
  checkHost();
  draw();
  return () => {
    watch.disconnect();
    if (media) media.removeEventListener("change", checkHost);
    clearTimeout(timer);
  };
}

export default { render };
