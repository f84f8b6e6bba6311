// flowkit dashboard: live updates over server-sent events (a run's page appends what changed;
// the other pages fetch themselves again), relative and local times, confirmations.
// Plain JavaScript, no build step, no inline code (the pages' CSP is default-src 'self').
"use strict";

(function () {
  var refreshes = 0;
  var appended = 0;
  var MAX_ROWS = 500; // a followed timeline keeps its newest rows only (older: "Earlier")
  var inFlight = false;
  var pending = false;
  var timer = null;

  function ago(ts) {
    var d = Date.now() / 1000 - ts;
    var future = d < 0;
    d = Math.abs(d);
    var text;
    if (d < 1) return "just now";
    if (d < 60) text = Math.floor(d) + " s";
    else if (d < 3600) text = Math.floor(d / 60) + " min";
    else if (d < 86400) text = Math.floor(d / 3600) + " h";
    else text = Math.floor(d / 86400) + " d";
    return future ? "in " + text : text + " ago";
  }

  function pad(n, w) {
    var s = String(n);
    while (s.length < (w || 2)) s = "0" + s;
    return s;
  }

  // an epoch time in the browser's time zone: 2026-12-06 10:22:01.250
  function local(ts) {
    var d = new Date(ts * 1000);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + "." +
      pad(d.getMilliseconds(), 3);
  }

  function freshenTimes(root) {
    var els = (root || document).querySelectorAll("time[data-ts]");
    for (var i = 0; i < els.length; i++) {
      var ts = parseFloat(els[i].getAttribute("data-ts"));
      if (isNaN(ts)) continue;
      if (els[i].getAttribute("data-format") === "local") {
        els[i].textContent = local(ts);
      } else {
        els[i].textContent = ago(ts);
        els[i].title = local(ts) + " (" + els[i].getAttribute("datetime") + ")";
      }
    }
  }

  function setLive(state) {
    var el = document.getElementById("live-status");
    if (!el) return;
    el.setAttribute("data-state", state);
    el.textContent = state === "open" ? "live" : state;
  }

  function swap(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    var live = document.querySelectorAll("[data-live][id]");
    for (var i = 0; i < live.length; i++) {
      var fresh = doc.getElementById(live[i].id);
      if (fresh) live[i].replaceWith(document.importNode(fresh, true));
    }
    freshenTimes(document);
    refreshes += 1;
    document.body.dataset.refreshed = String(refreshes);
  }

  function refresh() {
    if (inFlight) { pending = true; return; }
    inFlight = true;
    pending = false;
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html", "X-Flowkit-Refresh": "1" } })
      .then(function (resp) {
        if (resp.status === 401) { setLive("closed"); return null; }
        return resp.text();
      })
      .then(function (html) { if (html !== null) swap(html); })
      .catch(function () { /* the next change tries again */ })
      .then(function () {
        inFlight = false;
        if (pending) schedule();
      });
  }

  function schedule() {
    if (timer !== null) return;
    timer = window.setTimeout(function () { timer = null; refresh(); }, 150);
  }

  // -- a run's page: the stream sends what changed, the page applies it --------------------
  function fragment(html) {
    var t = document.createElement("template");
    t.innerHTML = html;
    return t.content;
  }

  function appendEvents(data) {
    var list = document.getElementById("timeline");
    if (!list) return;
    var count = document.getElementById("event-count");
    if (count && data.count !== undefined) count.textContent = String(data.count);
    var last = parseInt(list.getAttribute("data-last-seq") || "0", 10);
    if (list.getAttribute("data-follow") !== "true") {
      var newer = document.getElementById("events-newer");
      if (newer && data.last !== null && data.last > last) {
        newer.hidden = false;
        newer.textContent = "newer events up to #" + data.last + " (see Newest)";
      }
      return;
    }
    if (!data.html) return;
    var rows = fragment(data.html).querySelectorAll("li.event");
    var added = 0;
    if (data.reset) { // (far behind: the newest rows replace the page's, older ones "Earlier")
      list.replaceChildren();
      last = 0;
    }
    for (var i = 0; i < rows.length; i++) {
      var seq = parseInt(rows[i].getAttribute("data-seq"), 10);
      if (!(seq > last)) continue; // (already here: a reconnect sent it again)
      list.appendChild(document.importNode(rows[i], true));
      last = seq;
      added += 1;
    }
    if (!added) return;
    var none = list.querySelector("li.none");
    if (none) none.remove();
    list.setAttribute("data-last-seq", String(last));
    var all = list.querySelectorAll("li.event");
    var cut = all.length - MAX_ROWS;
    for (var j = 0; j < cut; j++) all[j].remove();
    if (cut > 0 || data.reset) earlierLink(list);
    freshenTimes(list);
    appended += added;
    document.body.dataset.appended = String(appended);
  }

  function earlierLink(list) {
    var first = list.querySelector("li.event");
    var pager = document.getElementById("timeline-pager");
    if (!first || !pager) return;
    var a = document.getElementById("events-earlier");
    if (!a) {
      a = document.createElement("a");
      a.id = "events-earlier";
      a.className = "button secondary";
      a.textContent = "‹ Earlier";
      pager.insertBefore(a, pager.firstChild);
    }
    a.href = list.getAttribute("data-base") + "?before=" + first.getAttribute("data-seq");
  }

  function replaceWith(id, html) {
    var el = document.getElementById(id);
    if (!el) return;
    el.replaceChildren(fragment(html));
    freshenTimes(el);
    confirmations(el);
    refreshes += 1;
    document.body.dataset.refreshed = String(refreshes);
  }

  function followRun(live) {
    var source = new EventSource(live.getAttribute("data-stream"));
    setLive("connecting");
    source.onopen = function () { setLive("open"); };
    source.onerror = function () {
      setLive(source.readyState === EventSource.CLOSED ? "closed" : "connecting");
    };
    source.addEventListener("events", function (ev) { appendEvents(JSON.parse(ev.data)); });
    source.addEventListener("state", function (ev) {
      var data = JSON.parse(ev.data);
      live.setAttribute("data-state-tag", data.tag);
      replaceWith("run-live", data.html);
    });
    source.addEventListener("actions", function (ev) {
      replaceWith("actions-live", JSON.parse(ev.data).html);
    });
    source.addEventListener("gone", function () { source.close(); setLive("closed"); });
    window.addEventListener("pagehide", function () { source.close(); });
  }

  function connect() {
    if (!window.EventSource || !document.getElementById("live-status")) return;
    var run = document.querySelector("[data-run-live]");
    if (run) { followRun(run); return; }
    if (!document.querySelector("[data-live]")) { setLive("closed"); return; }
    var source = new EventSource("/events");
    setLive("connecting");
    source.onopen = function () { setLive("open"); };
    source.onerror = function () {
      setLive(source.readyState === EventSource.CLOSED ? "closed" : "connecting");
    };
    source.addEventListener("change", schedule);
    window.addEventListener("pagehide", function () { source.close(); });
  }

  function confirmations(root) {
    var forms = (root || document).querySelectorAll("form[data-confirm]");
    for (var i = 0; i < forms.length; i++) {
      forms[i].addEventListener("submit", function (ev) {
        if (!window.confirm(this.getAttribute("data-confirm"))) ev.preventDefault();
      });
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    confirmations();
    freshenTimes(document);
    window.setInterval(function () { freshenTimes(document); }, 5000);
    connect();
  });
})();
