// The operator page: plain DOM, no build step. Reads the status API of the same app
// (same origin: in Azure the browser carries its Easy Auth session cookie) and redraws
// every few seconds. Every value from the API goes into the page as text, never as HTML.
"use strict";

(function () {
  const BASE = document.body.dataset.base || "";
  const REFRESH_MS = 3000;
  const STATES = ["Processed", "Compensated", "Error", "Pending", "Processing"];
  const COLOURS = { Processed: "#2e9e5b", Compensated: "#e0a43a", Error: "#d9534f", Pending: "#5b8def", Processing: "#8e6bd1" };
  const $ = (selector) => document.querySelector(selector);
  let me = { can_operate: false };
  let chart = null;
  let shown = null; // the order whose timeline is open

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  class ApiError extends Error {}

  async function api(path, options) {
    const response = await fetch(BASE + path, { credentials: "same-origin", headers: { Accept: "application/json" }, ...options });
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (!response.ok) {
      const reason = body && body.reason ? body.reason : response.statusText || "no answer";
      throw new ApiError(`${response.status}: ${reason}`);
    }
    return body;
  }

  // What went wrong, in one line. An action's message (a resubmit, a cancel, an approval, a
  // search) stays until the next action; a refresh's, or an order's timeline's, goes with
  // the next good refresh (which clears nothing else: it runs every few seconds).
  let problemKind = "";
  function problem(text, kind = "action") {
    if (!text && kind !== "action" && problemKind === "action") return;
    const node = $("#problem");
    node.textContent = text || "";
    node.hidden = !text;
    problemKind = text ? kind : "";
  }

  const short = (instance) => (instance ? String(instance).slice(0, 8) : "");
  const time = (iso) => (iso ? new Date(iso).toLocaleTimeString() : "");

  // --- who is looking ----------------------------------------------------------------------

  async function loadMe() {
    me = await api("/ops/me");
    const roles = me.auth === "none" ? "no sign-in (local)" : (me.roles.join(", ") || "no app role");
    $("#who").textContent = `${me.name || "you"}: ${roles}${me.can_operate ? " — may resubmit and cancel" : " — read only"}`;
    $("#who").dataset.canOperate = String(me.can_operate);
  }

  // --- counts over time --------------------------------------------------------------------

  async function loadCounts() {
    const counts = await api(`/ops/counts?hours=${encodeURIComponent($("#hours").value)}`);
    const head = $("#totals-head"), row = $("#totals-row");
    head.replaceChildren(...STATES.map((s) => el("th", s)));
    row.replaceChildren(...STATES.map((s) => {
      const cell = el("td", counts.totals[s] || 0, `state-${s}`);
      cell.dataset.count = s;
      return cell;
    }));
    const flying = Object.entries(counts.in_flight).map(([state, n]) => `${n} ${state}`);
    $("#in-flight").textContent = flying.join(", ") + (counts.truncated ? " (more than counted)" : "");
    $("#in-flight").dataset.inFlight = JSON.stringify(counts.in_flight);
    drawChart(counts);
  }

  function drawChart(counts) {
    if (typeof uPlot === "undefined") return;
    const data = [counts.times, ...STATES.map((s) => counts.series[s])];
    const box = $("#chart");
    const width = Math.max(400, box.clientWidth || 800);
    if (chart && chart.series.length === data.length && chart.data[0].length === data[0].length) {
      chart.setData(data);
      return;
    }
    if (chart) chart.destroy();
    chart = new uPlot({
      width, height: 240,
      scales: { x: { time: true } },
      axes: [{}, { label: `orders per ${counts.bucket_seconds / 60} min` }],
      series: [{}, ...STATES.map((s) => ({ label: s, stroke: COLOURS[s], width: 2, points: { show: false } }))],
    }, data, box);
  }

  // --- orders in Error and Compensated -----------------------------------------------------

  async function loadList(state, tableId, emptyId) {
    const page = await api(`/orders?state=${state}&limit=100`);
    const body = $(`#${tableId} tbody`);
    const snapshot = JSON.stringify(page.orders);
    if (body.dataset.snapshot !== snapshot) { // unchanged rows stay, with their buttons
      body.replaceChildren(...page.orders.map((o) => orderRow(o, state)));
      body.dataset.snapshot = snapshot;
    }
    $(`#${emptyId}`).hidden = page.orders.length > 0;
  }

  function orderRow(order, state) {
    const row = el("tr");
    row.dataset.orderId = order.order_id;
    const show = el("button", order.order_id, "link show-timeline");
    show.type = "button";
    show.addEventListener("click", () => openTimeline(order.order_id));
    const first = el("td");
    first.append(show);
    row.append(first, el("td", order.step), el("td", order.kind), el("td", order.attempt),
      el("td", order.last_error || "", "error-text"), el("td", time(order.updated_at)));
    const last = el("td");
    if (state === "Error" && me.can_operate) {
      const button = el("button", "resubmit", "resubmit");
      button.type = "button";
      button.addEventListener("click", () => resubmit(order.order_id, button));
      last.append(button);
    }
    row.append(last);
    return row;
  }

  async function resubmit(orderId, button) {
    button.disabled = true;
    button.textContent = "resubmitting…";
    try {
      const state = await api(`/orders/${encodeURIComponent(orderId)}/resubmit`, { method: "POST" });
      button.textContent = `resubmitted: ${state.state}`;
      problem("");
      await openTimeline(orderId);
      await refresh();
    } catch (error) {
      button.disabled = false;
      button.textContent = "resubmit";
      problem(`resubmit ${orderId}: ${error.message}`);
    }
  }

  // A cancel (POST /api/orders/{id}/cancel): offered to an operator for an order that has not ended.
  const ENDED = ["Processed", "Compensated", "Error"];

  function drawCancel(doc) {
    const note = $("#timeline-cancelled");
    const c = doc.cancel;
    note.textContent = c ? `cancel requested ${time(c.requested_at)} by ${c.by || "?"}: ${c.reason || "no reason given"}` : "";
    note.hidden = !c;
    $("#cancel-form").hidden = !(me.can_operate && !c && !ENDED.includes(doc.state));
  }

  async function cancelShown(event) {
    event.preventDefault();
    const orderId = $("#timeline").dataset.orderId;
    const button = $("#cancel-order");
    const reason = $("#cancel-reason").value.trim();
    button.disabled = true;
    button.textContent = "cancelling…";
    try {
      const doc = await api(`/orders/${encodeURIComponent(orderId)}/cancel`, {
        method: "POST",
        headers: { Accept: "application/json", "Content-Type": "application/json" },
        body: JSON.stringify(reason ? { reason } : {}),
      });
      $("#cancel-reason").value = "";
      drawCancel(doc);
      problem("");
      await refresh(); // redraws the timeline too
    } catch (error) {
      problem(`cancel ${orderId}: ${error.message}`);
    } finally {
      button.disabled = false;
      button.textContent = "cancel this order";
    }
  }

  // --- one order's timeline ----------------------------------------------------------------

  function lineKey(step, kind) { return `${step}/${kind}`; }

  function summarise(spans) {
    const lines = {};
    const line = (a) => {
      const key = lineKey(a["order.step"], a["order.kind"] || "action");
      return (lines[key] = lines[key] || { attempts: new Set(), calls: 0, hosts: new Set() });
    };
    let retries = 0, giveUps = 0, compensations = 0, calls = 0;
    const hosts = new Set();
    for (const span of spans) {
      const a = span.attributes || {};
      if (span.instance) hosts.add(short(span.instance));
      if (!a["order.step"]) continue;
      const l = line(a);
      if (span.name === "order.claim" || span.name === "order.compensate") {
        l.attempts.add(a["order.attempt"]);
        if (span.name === "order.compensate") compensations += 1;
      }
      if (span.kind === "CLIENT") { l.calls += 1; calls += 1; }
      if (span.name === "agent.run" || span.name === "order.claim" || span.name === "order.compensate") l.hosts.add(short(span.instance));
      if (span.name === "supervisor.retry") retries += 1;
      if (span.name === "supervisor.give_up") giveUps += 1;
    }
    return { lines, retries, giveUps, compensations, calls, hosts };
  }

  async function openTimeline(orderId) {
    shown = orderId;
    $("#order-input").value = orderId;
    try {
      const [doc, trace] = await Promise.all([
        api(`/orders/${encodeURIComponent(orderId)}`),
        api(`/orders/${encodeURIComponent(orderId)}/trace`),
      ]);
      if (shown !== orderId) return;
      drawTimeline(doc, trace);
      problem("", "refresh");
    } catch (error) {
      $("#timeline").hidden = true;
      problem(`order ${orderId}: ${error.message}`, "refresh");
    }
  }

  function drawTimeline(doc, trace) {
    const spans = trace.spans || [];
    const s = summarise(spans);
    $("#timeline").hidden = false;
    $("#timeline").dataset.orderId = doc.order_id;
    $("#timeline-order").textContent = doc.order_id;
    const state = $("#timeline-state");
    state.textContent = doc.state;
    state.className = `state state-${doc.state}`;
    drawCancel(doc);
    $("#timeline-summary").textContent = spans.length
      ? `${spans.length} spans in ${trace.trace_ids.length} trace(s); ${s.calls} calls to remote services; ` +
        `${s.retries} supervisor retries, ${s.giveUps} give-ups; ${s.compensations} compensation attempts; ` +
        `hosts: ${[...s.hosts].join(", ")}`
      : "no spans kept for this order (traces are sampled: its steps, attempts and errors below are the state store's)";
    const note = $("#timeline-note");
    note.textContent = trace.note || "";
    note.hidden = !trace.note;
    drawWaiting(doc);

    const rows = (doc.steps || []).filter((step) => !step.error).map((step) => {
      const l = s.lines[lineKey(step.step, step.kind)] || { attempts: new Set(), calls: 0, hosts: new Set() };
      const row = el("tr");
      row.dataset.step = step.step;
      row.dataset.kind = step.kind;
      // Claims of this line (each an attempt; "#n" in the spans is the order's fencing token).
      const attempts = l.attempts.size || "";
      row.append(el("td", step.step), el("td", step.kind), el("td", step.action), el("td", step.remote),
        el("td", step.state, `state state-${step.state}`), el("td", attempts), el("td", l.calls || ""),
        el("td", step.failure_count || ""), el("td", [...l.hosts].join(", ")),
        el("td", step.last_error || "", "error-text"));
      return row;
    });
    $("#timeline-steps tbody").replaceChildren(...rows);

    const box = $("#timeline-spans");
    if (!spans.length) { box.replaceChildren(); return; }
    const t0 = Math.min(...spans.map((x) => Date.parse(x.start)));
    const t1 = Math.max(...spans.map((x) => Date.parse(x.end)));
    const total = Math.max(1, t1 - t0);
    box.replaceChildren(...spans.map((span) => {
      const a = span.attributes || {};
      const row = el("div", undefined, "span-row");
      row.dataset.name = span.name;
      if (a["order.step"]) row.dataset.step = a["order.step"];
      if (a["order.attempt"] !== undefined) row.dataset.attempt = a["order.attempt"];
      row.dataset.host = short(span.instance);
      const what = [span.name, a["order.step"], a["order.kind"] === "compensation" ? "(undo)" : "",
        a["order.attempt"] !== undefined ? `#${a["order.attempt"]}` : "",
        a["order.outcome"] || a["order.state"] || "",
        a["http.response.status_code"] !== undefined ? `→ ${a["http.response.status_code"]}` : ""].filter(Boolean).join(" ");
      const label = el("span", what, "span-label");
      label.title = `${what}\n${span.start} (${span.duration_ms} ms)${span.status_message ? "\n" + span.status_message : ""}`;
      const track = el("div", undefined, "span-track");
      const bar = el("div", undefined, `span-bar kind-${a["order.kind"] || "action"} status-${span.status}` +
        (span.name.startsWith("supervisor.") ? " supervisor" : ""));
      bar.style.left = `${(100 * (Date.parse(span.start) - t0)) / total}%`;
      bar.style.width = `${(100 * Math.max(0, Date.parse(span.end) - Date.parse(span.start))) / total}%`;
      track.append(bar);
      row.append(label, track, el("span", `${short(span.instance)} +${((Date.parse(span.start) - t0) / 1000).toFixed(2)} s`, "span-host"));
      return row;
    }));
  }

  // --- a waiting step: approve or reject (POST /api/orders/{id}/events/{name}) --------------

  function drawWaiting(doc) {
    const waiting = doc.waiting;
    const box = $("#timeline-waiting");
    box.hidden = !waiting;
    box.dataset.orderId = doc.order_id;
    if (!waiting) return;
    box.dataset.event = waiting.event;
    $("#waiting-text").textContent = `step ${waiting.step} waits for ${waiting.event} until ${new Date(waiting.until).toLocaleString()}`;
    $("#waiting-actions").hidden = !me.can_operate;
  }

  async function decide(approved) {
    const box = $("#timeline-waiting");
    const orderId = box.dataset.orderId, event = box.dataset.event;
    const buttons = [$("#approve"), $("#reject")];
    buttons.forEach((b) => { b.disabled = true; });
    const note = $("#waiting-note").value.trim();
    const body = { approved, by: me.name || "operator", ...(note ? { note } : {}) };
    try {
      await api(`/orders/${encodeURIComponent(orderId)}/events/${encodeURIComponent(event)}`, {
        method: "POST", headers: { Accept: "application/json", "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
      $("#waiting-note").value = "";
      problem("");
      await openTimeline(orderId);
    } catch (error) {
      problem(`${approved ? "approve" : "reject"} ${orderId}: ${error.message}`);
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
  }

  // --- refresh -----------------------------------------------------------------------------

  // Other sections' scripts (ops-search.js) use these, and add loaders refreshed with the rest.
  const loaders = [];
  window.Ops = {
    api, el, problem, time, openTimeline, refresh: () => refresh(),
    canOperate: () => me.can_operate, addLoader: (load) => loaders.push(load),
  };

  // One refresh at a time: a tick (or an action's refresh) while one runs asks for one more
  // after it, so a slow answer (the counts scan the state rows) never piles requests up or
  // lets an older reply redraw over a newer one.
  let refreshing = null;
  let refreshAgain = false;
  function refresh() {
    if (refreshing) {
      refreshAgain = true;
      return refreshing;
    }
    refreshing = (async () => {
      do {
        refreshAgain = false;
        await refreshOnce();
      } while (refreshAgain);
    })().finally(() => {
      refreshing = null;
    });
    return refreshing;
  }

  async function refreshOnce() {
    try {
      await Promise.all([
        loadCounts(),
        loadList("Error", "error-orders", "error-empty"),
        loadList("Compensated", "compensated-orders", "compensated-empty"),
        ...loaders.map((load) => load()),
      ]);
      $("#refreshed").textContent = `updated ${new Date().toLocaleTimeString()}`;
      document.body.dataset.refreshed = String(Date.now());
      problem("", "refresh");
      if (shown) await openTimeline(shown);
    } catch (error) {
      problem(error.message, "refresh");
    }
  }

  async function start() {
    $("#order-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const id = $("#order-input").value.trim();
      if (id) openTimeline(id);
    });
    $("#approve").addEventListener("click", () => decide(true));
    $("#reject").addEventListener("click", () => decide(false));
    $("#cancel-form").addEventListener("submit", cancelShown);
    $("#hours").addEventListener("change", () => { if (chart) { chart.destroy(); chart = null; } refresh(); });
    try {
      await loadMe();
    } catch (error) {
      problem(error.message);
      return;
    }
    await refresh();
    setInterval(refresh, REFRESH_MS);
  }

  start();
})();
