// OSTE management UI: optional enhancements. Every page works without this script.
(function () {
  "use strict";
  // The dashboard refreshes its live part every few seconds (not while the tab is hidden).
  var live = document.getElementById("live");
  if (live) {
    var seconds = parseInt(live.getAttribute("data-refresh"), 10) || 5;
    setInterval(function () {
      if (document.hidden) { return; }
      fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "refresh" } })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (!html) { return; }
          var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
          if (fresh) { live.replaceChildren.apply(live, Array.prototype.slice.call(fresh.childNodes)); }
        })
        .catch(function () {});
    }, seconds * 1000);
  }
  // The schedule editor previews the next fire times as you type.
  var form = document.getElementById("schedule-form");
  if (form) {
    var target = document.getElementById("preview");
    var timer = null;
    var seq = 0;
    var update = function () {
      var params = new URLSearchParams();
      ["cron", "year", "month", "day", "week", "day_of_week", "hour", "minute", "second",
       "timezone", "dst_nonexistent", "dst_ambiguous"].forEach(function (name) {
        var field = form.elements[name];
        if (field && field.value) { params.set(name, field.value); }
      });
      var mine = ++seq;
      fetch(form.getAttribute("data-preview") + "?" + params.toString(),
            { credentials: "same-origin", headers: { "X-Requested-With": "preview" } })
        .then(function (r) { return r.text(); })
        .then(function (html) {
          if (mine !== seq) { return; }
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fragment = doc.getElementById("preview-fragment");
          if (fragment) { target.replaceChildren.apply(target, Array.prototype.slice.call(fragment.childNodes)); }
        })
        .catch(function () {});
    };
    form.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(update, 250); });
    form.addEventListener("change", function () { clearTimeout(timer); timer = setTimeout(update, 50); });
  }
})();
