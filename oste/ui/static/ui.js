// OSTE management UI: optional enhancements. Every page works without this script.
(function () {
  "use strict";
  // The dashboard's counters, charts and tables update in place from /ui/live (not while the tab is hidden).
  var live = document.getElementById("live");
  if (live && window.fetch) {
    var url = live.getAttribute("data-live");
    var seconds = parseInt(live.getAttribute("data-poll"), 10) || 3;
    var poll = function () {
      if (document.hidden) { return; }
      fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "live", "Accept": "application/json" } })
        .then(function (r) { return r.ok && (r.headers.get("content-type") || "").indexOf("json") >= 0 ? r.json() : null; })
        .then(function (data) {
          if (!data) { return; }
          Array.prototype.forEach.call(live.querySelectorAll("[data-figure]"), function (el) {
            var value = data.figures[el.getAttribute("data-figure")];
            if (value !== undefined && el.textContent !== value) { el.textContent = value; }
          });
          Array.prototype.forEach.call(live.querySelectorAll("[data-chart]"), function (el) {
            var svg = data.charts[el.getAttribute("data-chart")];
            if (svg !== undefined) { el.innerHTML = svg; }
          });
          Array.prototype.forEach.call(live.querySelectorAll("[data-tables]"), function (el) {
            var html = (data.tables || {})[el.getAttribute("data-tables")];
            if (html !== undefined && el.innerHTML !== html) { el.innerHTML = html; }
          });
          live.setAttribute("data-updated", String(Date.now()));
        })
        .catch(function () {});
    };
    setInterval(poll, seconds * 1000);
  }
  // Lists: a box that ticks every row of the page, and a count of the ticked ones.
  var pickAll = document.getElementById("pick-all");
  if (pickAll) {
    var boxes = document.querySelectorAll("input[type=checkbox][name=id][form=bulk]");
    var picked = document.getElementById("picked");
    var scope = document.querySelector("#bulk input[name=scope][value=selected]");
    var count = function () {
      var n = Array.prototype.filter.call(boxes, function (b) { return b.checked; }).length;
      if (picked) { picked.textContent = n + " ticked"; }
      pickAll.checked = n > 0 && n === boxes.length;
      pickAll.indeterminate = n > 0 && n < boxes.length;
      if (n && scope) { scope.checked = true; }
    };
    pickAll.hidden = false;
    pickAll.addEventListener("change", function () {
      Array.prototype.forEach.call(boxes, function (b) { b.checked = pickAll.checked; });
      count();
    });
    Array.prototype.forEach.call(boxes, function (b) { b.addEventListener("change", count); });
    count();
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
  // A file chooser with data-fills reads its file (an iCalendar) into the form's text box: the form
  // stays a plain urlencoded POST and the server parses the text.
  Array.prototype.forEach.call(document.querySelectorAll("input[type=file][data-fills]"), function (input) {
    input.addEventListener("change", function () {
      var target = document.getElementById(input.getAttribute("data-fills"));
      var file = input.files && input.files[0];
      if (!target || !file || !window.FileReader) { return; }
      var reader = new FileReader();
      reader.onload = function () { target.value = reader.result; };
      reader.readAsText(file);
    });
  });
})();
