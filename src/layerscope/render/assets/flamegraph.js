(function () {
  var svg = document.documentElement, W = parseFloat(svg.getAttribute("width")), CH = parseFloat(svg.getAttribute("data-char"));
  var total = parseFloat(svg.getAttribute("data-total")), unit = svg.getAttribute("data-unit");
  var frames = Array.prototype.slice.call(document.querySelectorAll("g.f"));
  var details = document.getElementById("details");
  function label(g, w) {
    var t = g.querySelector("text"), name = g.querySelector("title").textContent.split(" \u2014 ")[0];
    var n = Math.floor((w - 6) / CH);
    t.textContent = n < 3 ? "" : (name.length <= n ? name : name.slice(0, n - 1) + "\u2026");
  }
  function zoom(x0, w0, d0) {
    frames.forEach(function (g) {
      var x = parseFloat(g.dataset.x), w = parseFloat(g.dataset.w), d = parseInt(g.dataset.d, 10);
      var inside = x >= x0 - 1e-9 && x + w <= x0 + w0 + 1e-9, above = d < d0 && x <= x0 + 1e-9 && x + w >= x0 + w0 - 1e-9;
      var r = g.querySelector("rect"), t = g.querySelector("text");
      if (!inside && !above) { g.style.display = "none"; return; }
      g.style.display = "";
      var nx = above ? 0 : (x - x0) / w0 * W, nw = above ? W : w / w0 * W;
      r.setAttribute("x", nx.toFixed(2)); r.setAttribute("width", Math.max(nw - 0.5, 0.5).toFixed(2));
      t.setAttribute("x", (nx + 3).toFixed(2)); label(g, nw);
    });
  }
  frames.forEach(function (g) {
    g.addEventListener("click", function () {
      zoom(parseFloat(g.dataset.x), parseFloat(g.dataset.w), parseInt(g.dataset.d, 10));
    });
    g.addEventListener("mouseover", function () { details.textContent = g.querySelector("title").textContent; });
  });
  document.getElementById("reset").addEventListener("click", function () { zoom(0, 1, 0); });
  document.getElementById("search").addEventListener("click", function () {
    var term = window.prompt("Highlight frames whose name contains:", "");
    var hit = 0, seen = [];
    frames.forEach(function (g) {
      var name = g.querySelector("title").textContent.split(" \u2014 ")[0];
      var match = !!term && name.indexOf(term) >= 0;
      g.classList.toggle("hit", match);
      if (match && !seen.some(function (s) { return parseFloat(g.dataset.x) >= s[0] && parseFloat(g.dataset.x) < s[1]; })) {
        hit += parseFloat(g.dataset.v); seen.push([parseFloat(g.dataset.x), parseFloat(g.dataset.x) + parseFloat(g.dataset.w)]);
      }
    });
    details.textContent = term ? "\u201c" + term + "\u201d: " + (100 * hit / total).toFixed(2) + "% of " + total.toFixed(1) + " " + unit : " ";
  });
})();
