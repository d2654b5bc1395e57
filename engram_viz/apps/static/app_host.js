// The `engram-viz app` page's host for the gate view (apps/app_server.py): a small model with
// anywidget's interface (get, set, save_changes, on, off, send) kept in step with the server's
// comparison over a websocket, and the page URL kept in step with the view's settings.
const app = document.getElementById("ev-app");
const query = app.dataset.query; // '?token=...' or ''
const view = (await import(`./gate_view.js${query}`)).default;

const state = {};
const handlers = {};
let pending = {};
const fire = (name) => (handlers[`change:${name}`] || []).forEach((cb) => cb());
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

const URL_SETTINGS = ["layer", "stream", "view", "theme"];

function keepUrl() {
  const params = new URLSearchParams(location.search);
  for (const k of "abcdefgh") params.delete(k);
  (state.prompts || []).forEach((p, i) => params.set("abcdefgh"[i], p));
  for (const k of URL_SETTINGS) if (state[k] !== undefined) params.set(k, String(state[k]));
  if (state.theme === "auto") params.delete("theme");
  history.replaceState(null, "", `${location.pathname}?${params}`);
}

const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${location.pathname.replace(/[^/]*$/, "")}ws${location.search}`;
const ws = new WebSocket(wsUrl);
const model = {
  get: (name) => state[name],
  set: (name, value) => {
    const changed = !same(state[name], value);
    state[name] = value;
    pending[name] = value;
    if (changed) fire(name);
  },
  save_changes: () => {
    if (Object.keys(pending).length && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "set", state: pending }));
    pending = {};
    keepUrl();
  },
  on: (event, cb) => (handlers[event] ||= []).push(cb),
  off: (event, cb) => {
    handlers[event] = cb ? (handlers[event] || []).filter((f) => f !== cb) : [];
  },
  send: () => {},
};

let shown = false;
ws.onmessage = (event) => {
  const msg = JSON.parse(event.data);
  const changed = Object.keys(msg.state).filter((k) => !same(state[k], msg.state[k]));
  Object.assign(state, msg.state);
  if (!shown) {
    app.replaceChildren();
    view.render({ model, el: app });
    shown = true;
  } else {
    changed.forEach(fire);
  }
  keepUrl();
};
ws.onclose = (event) => {
  const note = document.createElement("p");
  note.className = "ev-loading";
  note.textContent = `engram-viz app: the connection closed (${event.reason || event.code}); reload the page to start again.`;
  app.prepend(note);
};
