// runledger ui: live updates of a run over server-sent events, the sign-in file reader, the run list's groups.
// Everything else is plain server-rendered HTML and forms.
(function () {
  "use strict";

  function follow(run) {
    var liveUrl = run.getAttribute("data-live-url");
    var eventsUrl = run.getAttribute("data-events-url");
    if (!window.EventSource || !liveUrl || !eventsUrl) return;
    var source = new EventSource(eventsUrl);
    var fetching = false, again = false;
    function refresh() {
      if (fetching) { again = true; return; }
      fetching = true;
      fetch(liveUrl, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          // Not while the viewer is typing into a form of the live part: the next change will do.
          var active = document.activeElement;
          var live = document.getElementById("live");
          if (html !== null && live && !(active && live.contains(active) && active.tagName === "INPUT")) {
            live.innerHTML = html;
            live.setAttribute("data-refreshed", String(Date.now()));
          }
        })
        .finally(function () {
          fetching = false;
          if (again) { again = false; refresh(); }
        });
    }
    source.addEventListener("changed", refresh);
    window.addEventListener("beforeunload", function () { source.close(); });
  }

  function fileFills(input) {
    input.addEventListener("change", function () {
      var target = document.getElementById(input.getAttribute("data-fills"));
      var file = input.files && input.files[0];
      if (!target || !file) return;
      file.text().then(function (text) { target.value = text; });
    });
  }

  // The run list: a run's toggle hides or shows the forks and child runs listed under it.
  function groupToggle(button) {
    button.addEventListener("click", function () {
      var open = button.getAttribute("aria-expanded") !== "true";
      var id = button.getAttribute("data-toggles");
      document.querySelectorAll("tr[data-group]").forEach(function (row) {
        if (row.getAttribute("data-group") === id) row.hidden = !open;
      });
      button.setAttribute("aria-expanded", String(open));
      button.textContent = (open ? "\u25be " : "\u25b8 ") + button.textContent.slice(2);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("button.toggle[data-toggles]").forEach(groupToggle);
    var run = document.getElementById("run");
    if (run) follow(run);
    document.querySelectorAll("input[type=file][data-fills]").forEach(fileFills);
  });
})();
