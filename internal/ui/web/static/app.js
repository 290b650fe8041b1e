// kairon-ui live updates: listen to /api/v1/events (server-sent events) and,
// when a kind this page shows changes, fetch the page again and swap in its
// #live region. Filters outside #live keep what is being typed.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  var body = document.body;
  if (!live || !window.EventSource) {
    return;
  }
  var wanted = (body.dataset.kinds || "").split(" ").filter(Boolean);
  var timer = null, busy = false, again = false;

  function say(state, text) {
    body.dataset.live = state;
    if (status) {
      status.textContent = text;
      status.className = state;
    }
  }

  function refresh() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    fetch(location.href, { cache: "no-store", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        if (fresh) {
          live.innerHTML = fresh.innerHTML;
        }
        body.dataset.refreshes = String((Number(body.dataset.refreshes) || 0) + 1);
        if (body.dataset.live === "stale") {
          say("connected", "live");
        }
      })
      .catch(function (e) {
        say("stale", "stale: " + e.message);
      })
      .finally(function () {
        busy = false;
        if (again) {
          again = false;
          schedule();
        }
      });
  }

  // At most one refresh per 250 ms, however many changes arrive.
  function schedule() {
    if (timer === null) {
      timer = setTimeout(function () {
        timer = null;
        refresh();
      }, 250);
    }
  }

  var es = new EventSource("/api/v1/events");
  es.onopen = function () {
    say("connected", "live");
    // Whatever changed before the stream was open is fetched now.
    schedule();
  };
  es.addEventListener("change", function (ev) {
    var kinds = JSON.parse(ev.data).kinds || [];
    if (wanted.length === 0 || kinds.some(function (k) { return wanted.indexOf(k) >= 0; })) {
      schedule();
    }
  });
  es.onerror = function () {
    say("reconnecting", "reconnecting…");
  };
})();
