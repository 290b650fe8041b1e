// kairon-ui live updates: listen to /api/v1/events (server-sent events) and,
// when a kind this page shows changes, fetch the page again and swap in its
// #live region. Filters outside #live keep what is being typed.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  var body = document.body;
  if (!live || body.dataset.live === "off") {
    return;
  }
  setupActions();
  if (!window.EventSource) {
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
          swap(fresh);
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

  // swap puts the fresh live region in place, keeping what the user was
  // doing in it: the action panels open and the numbers typed.
  function swap(fresh) {
    var open = [], values = {};
    live.querySelectorAll("details[id][open]").forEach(function (d) { open.push(d.id); });
    live.querySelectorAll("form[data-action] input[id]").forEach(function (i) {
      values[i.id] = i.type === "checkbox" ? i.checked : i.value;
    });
    var focused = document.activeElement && document.activeElement.id;
    live.innerHTML = fresh.innerHTML;
    open.forEach(function (id) {
      var d = document.getElementById(id);
      if (d) {
        d.open = true;
      }
    });
    Object.keys(values).forEach(function (id) {
      var i = document.getElementById(id);
      if (i && i.type === "checkbox") {
        i.checked = values[id];
      } else if (i) {
        i.value = values[id];
      }
    });
    if (focused && document.getElementById(focused)) {
      document.getElementById(focused).focus();
    }
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

  // Actions: a form with data-action="NAME" posts its fields as JSON to
  // /api/v1/actions/NAME, with the X-Kairon-UI header every action needs,
  // and shows the answer, or the refusal exactly as the API server gave
  // it, in #action-result.
  function setupActions() {
    var out = document.getElementById("action-result");
    document.addEventListener("submit", function (ev) {
      var form = ev.target;
      if (!form.dataset || !form.dataset.action) {
        return;
      }
      ev.preventDefault();
      var req = {};
      new FormData(form).forEach(function (v, k) {
        req[k] = k === "replicas" ? Number(v) : k === "untilEmpty" ? v === "on" : v;
      });
      var button = form.querySelector("button");
      if (button) {
        button.disabled = true;
      }
      out.hidden = false;
      out.className = "pending";
      out.textContent = form.dataset.action + "…";
      fetch("/api/v1/actions/" + form.dataset.action, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Kairon-UI": "1" },
        body: JSON.stringify(req)
      }).then(function (r) {
        return r.json().then(function (body) {
          return { ok: r.ok, status: r.status, body: body };
        });
      }).then(function (res) {
        show(out, form.dataset.action, res);
      }).catch(function (e) {
        out.className = "refused";
        out.textContent = form.dataset.action + " failed: " + e.message;
      }).finally(function () {
        if (button) {
          button.disabled = false;
        }
      });
    });
  }

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) {
      e.textContent = text;
    }
    if (cls) {
      e.className = cls;
    }
    return e;
  }

  function show(out, action, res) {
    out.innerHTML = "";
    out.dataset.action = action;
    out.dataset.status = String(res.status);
    if (!res.ok) {
      out.className = "refused";
      out.appendChild(el("b", action + " refused (HTTP " + res.status + "): "));
      out.appendChild(el("span", res.body.error, "message"));
      return;
    }
    out.className = "done";
    var b = res.body;
    if (action === "evacuate") {
      out.appendChild(el("b", "Evacuation of " + b.node + ": ", ""));
      out.appendChild(el("span", b.summary, "summary"));
      var lists = [["created", "Migration created", b.created], ["inflight", "Already migrating", b.inFlight],
        ["skipped", "Skipped", b.skipped], ["deleting", "Being deleted", b.deleting]];
      lists.forEach(function (l) {
        if (!l[2] || l[2].length === 0) {
          return;
        }
        out.appendChild(el("h3", l[1] + " (" + l[2].length + ")"));
        var ul = el("ul", undefined, l[0]);
        l[2].forEach(function (m) {
          var li = el("li");
          li.dataset.machine = m.namespace + "/" + m.name;
          li.appendChild(el("span", m.namespace + "/" + m.name, "machine"));
          if (m.migration) {
            li.appendChild(el("span", " → " + m.migration, "migration"));
          }
          if (m.reason) {
            li.appendChild(el("span", ": " + m.reason, "reason"));
          }
          ul.appendChild(li);
        });
        out.appendChild(ul);
      });
      if (b.job) {
        out.appendChild(el("p", "Evacuation " + b.job.id + " keeps going until " + b.node + " is empty; its progress is shown below.", "job"));
      }
    } else if (action === "evacuate-cancel") {
      out.appendChild(el("span", "Evacuation " + b.id + " of " + b.node + ": " + b.state + (b.reason ? " (" + b.reason + ")" : ""), "summary"));
    } else if (action === "migrate") {
      out.appendChild(el("span", "MachineMigration " + b.namespace + "/" + b.migration + " created: " + b.machine +
        " from " + b.sourceNode + " to " + (b.targetNode || "the scheduler's choice") + " (" + b.strategy + ")", "summary"));
    } else if (action === "scale") {
      out.appendChild(el("span", "MachinePool " + b.namespace + "/" + b.pool + " scaled to " + b.replicas, "summary"));
    }
  }
})();
