// flowkit dashboard: live updates over server-sent events, relative times, confirmations.
// Plain JavaScript, no build step, no inline code (the pages' CSP is default-src 'self').
"use strict";

(function () {
  var refreshes = 0;
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

  function freshenTimes(root) {
    var els = (root || document).querySelectorAll("time[data-ts]");
    for (var i = 0; i < els.length; i++) {
      var ts = parseFloat(els[i].getAttribute("data-ts"));
      if (!isNaN(ts)) els[i].textContent = ago(ts);
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

  function connect() {
    if (!window.EventSource || !document.getElementById("live-status")) return;
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

  function confirmations() {
    var forms = document.querySelectorAll("form[data-confirm]");
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
