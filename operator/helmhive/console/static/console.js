// Helmhive console: live updates. The server tells this page, over Server-Sent Events fed by
// Kubernetes watches, that something changed; the page then asks for its own <main> again.
// No polling per object, no framework. Text from the server is set with textContent; <main> is
// HTML the server rendered and escaped.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var main = document.getElementById("main");
  var marker = main.querySelector("[data-path]");
  var path = marker ? marker.getAttribute("data-path") : location.pathname;
  var watches = marker ? marker.getAttribute("data-watches") : "";
  if (path !== location.pathname + location.search) {
    history.replaceState(null, "", path);  // after an Approve (a POST), stay on the change's page
  }
  var scheduled = false, busy = false, again = false;

  function say(text, state) {
    live.textContent = text;
    live.className = state;
  }

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(path + (path.indexOf("?") < 0 ? "?" : "&") + "fragment=1", { credentials: "same-origin" })
      .then(function (r) { return r.text(); })
      .then(function (body) {
        var focused = document.activeElement && document.activeElement.id;
        var typed = {};  // a search being filled in (a GET form, never the Approve form) survives the refresh
        main.querySelectorAll("form[method=get] input[id], form[method=get] select[id]").forEach(function (el) {
          typed[el.id] = el.value;
        });
        main.innerHTML = body;
        Object.keys(typed).forEach(function (id) {
          var el = document.getElementById(id);
          if (el) { el.value = typed[id]; }
        });
        if (focused) {
          var el = document.getElementById(focused);
          if (el) { el.focus(); }
        }
        main.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () { say("the console cannot be reached; retrying", "bad"); })
      .then(function () {
        busy = false;
        if (again) { again = false; soon(); }
      });
  }

  function soon() {
    if (scheduled) { return; }
    scheduled = true;
    setTimeout(function () { scheduled = false; refresh(); }, 150);
  }

  var source = new EventSource("/events?watches=" + encodeURIComponent(watches || ""));
  source.addEventListener("hello", function () { say("live", "ok"); soon(); });
  source.addEventListener("changed", soon);
  source.addEventListener("resync", function () { say("live", "ok"); soon(); });
  source.addEventListener("lost", function (ev) {
    var d = JSON.parse(ev.data);
    say("live updates lost (" + d.kind + "): " + d.detail + "; retrying", "bad");
    soon();
  });
  source.onerror = function () { say("the console cannot be reached; retrying", "bad"); };
})();
