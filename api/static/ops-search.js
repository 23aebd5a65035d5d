// The operator page's search and bulk sections (api/search.py): the orders in Error grouped
// by cause, each group with a resubmit button for operators, and a customer's orders, newest
// first, page by page. Uses ops.js's helpers (window.Ops); every value goes in as text.
"use strict";

(function () {
  const Ops = window.Ops;
  const $ = (selector) => document.querySelector(selector);
  const busy = new Set(); // groups being resubmitted from this page

  // --- the orders in Error, by cause ----------------------------------------------------------

  async function loadGroups() {
    const page = await Ops.api("/errors?limit=100");
    const body = $("#error-groups tbody");
    const snapshot = JSON.stringify([page.groups, Ops.canOperate(), [...busy]]);
    if (body.dataset.snapshot !== snapshot) {
      body.replaceChildren(...page.groups.map(groupRow));
      body.dataset.snapshot = snapshot;
    }
    $("#error-groups-empty").hidden = page.groups.length > 0;
  }

  function groupRow(group) {
    const row = Ops.el("tr");
    row.dataset.group = group.group;
    row.dataset.count = group.count;
    const sample = Ops.el("button", group.sample_order, "link show-timeline");
    sample.type = "button";
    sample.title = group.sample_error;
    sample.addEventListener("click", () => Ops.openTimeline(group.sample_order));
    const example = Ops.el("td");
    example.append(sample);
    row.append(Ops.el("td", group.count + (group.count_capped ? "+" : "")), Ops.el("td", group.step),
      Ops.el("td", group.kind), Ops.el("td", group.failed_compensations.join(", ")),
      Ops.el("td", group.error, "error-text"), example, Ops.el("td", Ops.time(group.last_seen)));
    const last = Ops.el("td");
    if (Ops.canOperate()) {
      const button = Ops.el("button", busy.has(group.group) ? "resubmitting…" : "resubmit group", "resubmit resubmit-group");
      button.type = "button";
      button.disabled = busy.has(group.group);
      button.addEventListener("click", () => resubmitGroup(group.group, button));
      last.append(button);
    }
    row.append(last);
    return row;
  }

  async function resubmitGroup(group, button) {
    // One bounded call after the other, each continuing where the last stopped, until done.
    busy.add(group);
    button.disabled = true;
    let done = 0, continuation = null;
    try {
      do {
        const query = continuation ? `?continuation=${encodeURIComponent(continuation)}` : "";
        const step = await Ops.api(`/errors/${encodeURIComponent(group)}/resubmit${query}`, { method: "POST" });
        done += step.resubmitted;
        button.textContent = `resubmitted ${done}…`;
        continuation = step.continuation;
      } while (continuation);
      Ops.problem("");
    } catch (error) {
      Ops.problem(`resubmit group ${group}: ${error.message}`);
    } finally {
      busy.delete(group);
    }
    await Ops.refresh();
  }

  // --- a customer's orders -----------------------------------------------------------------------

  let search = null; // {customer, since, until, continuation}

  function iso(value) {
    return value ? new Date(value).toISOString() : null; // a datetime-local field is the browser's local time
  }

  async function loadCustomer(more) {
    const asked = search; // a new search while this one waits replaces it: its reply is dropped
    const params = new URLSearchParams({ customer: search.customer, limit: "20" });
    if (search.since) params.set("since", search.since);
    if (search.until) params.set("until", search.until);
    if (more && search.continuation) params.set("continuation", search.continuation);
    const page = await Ops.api(`/orders?${params}`);
    if (search !== asked) return;
    const body = $("#customer-orders tbody");
    const rows = page.orders.map((order) => {
      const row = Ops.el("tr");
      row.dataset.orderId = order.order_id;
      const show = Ops.el("button", order.order_id, "link show-timeline");
      show.type = "button";
      show.addEventListener("click", () => Ops.openTimeline(order.order_id));
      const first = Ops.el("td");
      first.append(show);
      row.append(first, Ops.el("td", order.state, `state state-${order.state}`), Ops.el("td", order.step),
        Ops.el("td", order.kind), Ops.el("td", new Date(order.created_at).toLocaleString()),
        Ops.el("td", order.last_error || "", "error-text"));
      return row;
    });
    if (more) body.append(...rows); else body.replaceChildren(...rows);
    search.continuation = page.continuation;
    const any = body.children.length > 0;
    $("#customer-orders").hidden = !any;
    $("#customer-empty").hidden = any;
    $("#customer-more").hidden = !page.continuation;
  }

  async function ask(more) {
    try {
      await loadCustomer(more);
      Ops.problem("");
    } catch (error) {
      Ops.problem(`customer ${search.customer}: ${error.message}`);
    }
  }

  $("#customer-form").addEventListener("submit", (event) => {
    event.preventDefault();
    search = {
      customer: $("#customer-input").value.trim(), since: iso($("#customer-since").value),
      until: iso($("#customer-until").value), continuation: null,
    };
    if (search.customer) ask(false);
  });
  $("#customer-more").addEventListener("click", async () => {
    const more = $("#customer-more");
    if (more.disabled) return; // one page at a time: a second click would ask for the same page
    more.disabled = true;
    try {
      await ask(true);
    } finally {
      more.disabled = false;
    }
  });
  Ops.addLoader(loadGroups);
})();
