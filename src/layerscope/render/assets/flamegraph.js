(function (svg) {
  // Works in a standalone .svg (the script's document is the svg) and inlined in HTML (several
  // graphs per page): everything is looked up inside this script's own <svg>.
  var W = parseFloat(svg.getAttribute("width")), CH = parseFloat(svg.getAttribute("data-char"));
  var total = parseFloat(svg.getAttribute("data-total")), unit = svg.getAttribute("data-unit");
  var frames = Array.prototype.slice.call(svg.querySelectorAll("g.f"));
  var details = svg.querySelector(".details");
  function name(g) { return g.querySelector("title").textContent.split(" \u2014 ")[0]; }
  // frames too narrow for a label are written without a <text>: made here when zoom widens them
  function textOf(g) {
    var t = g.querySelector("text");
    if (!t) {
      t = document.createElementNS("http://www.w3.org/2000/svg", "text");
      t.setAttribute("y", (parseFloat(g.querySelector("rect").getAttribute("y")) + parseFloat(svg.getAttribute("font-size"))).toString());
      g.appendChild(t);
    }
    return t;
  }
  function label(g, w) {
    var t = textOf(g), n = Math.floor((w - 6) / CH), s = name(g);
    t.textContent = n < 3 ? "" : (s.length <= n ? s : s.slice(0, n - 1) + "\u2026");
  }
  function zoom(x0, w0, d0) {
    frames.forEach(function (g) {
      var x = parseFloat(g.dataset.x), w = parseFloat(g.dataset.w), d = parseInt(g.dataset.d, 10);
      var inside = x >= x0 - 1e-9 && x + w <= x0 + w0 + 1e-9;
      var above = d < d0 && x <= x0 + 1e-9 && x + w >= x0 + w0 - 1e-9;
      var r = g.querySelector("rect"), t = textOf(g);
      if (!inside && !above) { g.style.display = "none"; return; }
      g.style.display = "";
      var nx = above ? 0 : (x - x0) / w0 * W, nw = above ? W : w / w0 * W;
      r.setAttribute("x", nx.toFixed(2));
      r.setAttribute("width", Math.max(nw - 0.5, 0.5).toFixed(2));
      t.setAttribute("x", (nx + 3).toFixed(2));
      label(g, nw);
    });
  }
  frames.forEach(function (g) {
    g.addEventListener("click", function () {
      zoom(parseFloat(g.dataset.x), parseFloat(g.dataset.w), parseInt(g.dataset.d, 10));
    });
    g.addEventListener("mouseover", function () {
      details.textContent = g.querySelector("title").textContent;
    });
  });
  svg.querySelector(".reset").addEventListener("click", function () { zoom(0, 1, 0); });
  svg.querySelector(".search").addEventListener("click", function () {
    var term = window.prompt("Highlight frames whose name contains:", "");
    var hit = 0, spans = [];
    frames.forEach(function (g) {
      var match = !!term && name(g).indexOf(term) >= 0;
      g.classList.toggle("hit", match);
      var x = parseFloat(g.dataset.x), w = parseFloat(g.dataset.w);
      var nested = spans.some(function (s) { return x >= s[0] && x < s[1]; });
      if (match && !nested) { hit += parseFloat(g.dataset.v); spans.push([x, x + w]); }
    });
    details.textContent = term
      ? "\u201c" + term + "\u201d: " + (100 * hit / total).toFixed(2) + "% of " + total.toFixed(1) + " " + unit
      : " ";
  });
})((document.currentScript && document.currentScript.closest && document.currentScript.closest("svg"))
   || document.documentElement);
