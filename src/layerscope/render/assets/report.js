(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("data").textContent);
  var S = D.strings, F = D.fields, FI = {};
  F.forEach(function (f, i) { FI[f] = i; });
  function str(i) { return i < 0 ? "" : S[i]; }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);  // text only, never HTML
    return e;
  }
  // keyboard: Tab reaches what a click does (tree toggles, sortable headers), Enter or Space acts
  function activates(node, act, label) {
    node.tabIndex = 0; node.setAttribute("role", "button");
    if (label) node.setAttribute("aria-label", label);
    node.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); act(); }
    });
  }
  function time(us) {
    if (!us) return "";
    var a = Math.abs(us);
    return a < 1000 ? us.toFixed(1) + "\u00b5s" : a < 1e6 ? (us / 1000).toFixed(2) + "ms" : (us / 1e6).toFixed(3) + "s";
  }
  function bytes(n) {
    if (!n) return "";
    var a = Math.abs(n), u = [["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
    for (var i = 0; i < u.length; i++) if (a >= u[i][1]) return (n / u[i][1]).toFixed(2) + " " + u[i][0];
    return n + " B";
  }
  function si(n) {
    if (!n) return "";
    var u = [["P", 1e15], ["T", 1e12], ["G", 1e9], ["M", 1e6], ["K", 1e3]];
    for (var i = 0; i < u.length; i++) if (Math.abs(n) >= u[i][1]) return (n / u[i][1]).toFixed(2) + u[i][0];
    return String(Math.round(n));
  }
  var shareField = D.totals.device_us > 0 ? "device_us" : "cpu_us";
  var whole = D.totals[shareField] || 1;

  // ----- header -------------------------------------------------------------------------------
  document.getElementById("title").textContent = "layerscope \u00b7 " + (D.meta.model || "profile");
  document.getElementById("sub").textContent = [
    "torch " + (D.meta.torch_version || "?"), "layerscope " + (D.meta.layerscope_version || "?"),
    D.meta.created_at || "", D.meta.devices && D.meta.devices.length ? D.meta.devices.map(function (d) { return d.name; }).join(", ") : "CPU",
    D.meta.options_text || ""].filter(Boolean).join(" \u00b7 ");
  var cards = document.getElementById("cards");
  var achieved = D.totals.flops ? D.totals.flops / ((D.totals.device_us || D.totals.cpu_us) / 1e6) : 0;
  // the step time and the absolute memory peak lead (drawn with the page); these follow them
  [["CPU time", time(D.totals.cpu_us)], ["Device time", time(D.totals.device_us)],
   ["FLOPs", si(D.totals.flops)], ["Achieved", achieved ? si(achieved) + "FLOP/s" : ""]].forEach(function (c) {
    if (!c[1]) return;
    var card = el("div", "card"); card.appendChild(el("div", "v", c[1])); card.appendChild(el("div", "k", c[0]));
    cards.appendChild(card);
  });

  // ----- module tree --------------------------------------------------------------------------
  var M = D.modules, n = M.path.length, children = [], phase = "both", sortKey = null, sortAsc = false;
  for (var i = 0; i < n; i++) children.push([]);
  for (i = 1; i < n; i++) if (M.parent[i] >= 0) children[M.parent[i]].push(i);
  var order0 = children.map(function (c) { return c.slice(); });
  function val(i, field) {
    var f = M.fwd[i][FI[field]], b = M.bwd[i][FI[field]];
    return phase === "forward" ? f : phase === "backward" ? b : f + b;
  }
  var depth = new Array(n).fill(0);
  for (i = 1; i < n; i++) depth[i] = depth[M.parent[i]] + 1;
  var open = new Array(n).fill(false);
  for (i = 0; i < n; i++) open[i] = depth[i] < 2;
  var hottest = [];
  for (i = 0; i < n; i++) if (!children[i].length) hottest.push(i);
  hottest.sort(function (a, b) { return (M.fwd[b][FI[shareField]] + M.bwd[b][FI[shareField]]) - (M.fwd[a][FI[shareField]] + M.bwd[a][FI[shareField]]); });
  var hot = document.getElementById("hot");
  hottest.slice(0, 5).forEach(function (k) {
    var li = el("li", null, (str(M.path[k]) || "(root)") + " (" + str(M.type[k]) + "): ");
    li.appendChild(el("b", null, time(M.fwd[k][FI[shareField]] + M.bwd[k][FI[shareField]])));
    hot.appendChild(li);
  });
  var COLS = [["Module", null], ["Type", null], ["Calls", "calls"], ["Output", null], ["Self", "self_cpu_us"], ["Total", "cpu_us"],
              ["Device", "device_us"], ["Alloc", "cpu_alloc_bytes"], ["Net alloc", "net_bytes"],
              ["FLOPs", "flops"], ["FLOP/s", "flops_per_s"], ["Params", "params"], ["Share", "share"]];
  // achieved FLOP/s: FLOPs over device time when there is any, else CPU time (blank without FLOPs)
  function rate(i) {
    var f = val(i, "flops"), t = val(i, "device_us") > 0 ? val(i, "device_us") : val(i, "cpu_us");
    return f > 0 && t > 0 ? f / t * 1e6 : 0;
  }
  function cellValue(i, key) {
    if (key === "calls") return M.calls[i];
    if (key === "params") return M.params[i];
    if (key === "share") return val(i, shareField);
    if (key === "flops_per_s") return rate(i);
    if (key === "cpu_alloc_bytes") return val(i, "cpu_alloc_bytes") + val(i, "device_alloc_bytes");
    return val(i, key);
  }
  var thead = document.querySelector("#tree thead tr"), tbody = document.querySelector("#tree tbody");
  COLS.forEach(function (c, k) {
    var th = el("th", k < 2 || k === 3 ? "l" : "", c[0]);
    if (c[1] === "flops_per_s") th.title = "achieved FLOP/s: FLOPs over device time when there is any, else CPU time";
    if (c[1] === "net_bytes") th.title = "allocated minus freed inside the module: what it leaves " +
      "alive (activations kept for backward); negative when it frees more than it allocates";
    function sortTree() {
      if (sortKey === c[1]) sortAsc = !sortAsc; else { sortKey = c[1]; sortAsc = false; }
      Array.prototype.forEach.call(thead.children, function (h) { h.classList.remove("sorted", "asc"); });
      th.classList.add("sorted"); if (sortAsc) th.classList.add("asc");
      renderTree();
    }
    if (c[1]) { th.addEventListener("click", sortTree); activates(th, sortTree, "sort by " + c[0]); }
    thead.appendChild(th);
  });
  var filter = "";
  function matches(i) { return !filter || str(M.path[i]).toLowerCase().indexOf(filter) >= 0; }
  function anyMatch(i) { if (matches(i)) return true; for (var k = 0; k < children[i].length; k++) if (anyMatch(children[i][k])) return true; return false; }
  function renderTree() {
    tbody.textContent = "";
    (function walk(i) {
      if (filter && !anyMatch(i)) return;
      var tr = el("tr"); tr.dataset.path = str(M.path[i]);
      var tip = [];
      if (M.in && M.in[i] >= 0) tip.push("input " + str(M.in[i]));
      if (M.out && M.out[i] >= 0) tip.push("output " + str(M.out[i]));
      if (M.source && M.source[i] >= 0) tip.push(str(M.type[i]) + ".forward defined at " + str(M.source[i]));
      if (tip.length) tr.title = tip.join("\n");
      var name = el("td", "l");
      name.style.paddingLeft = (8 + 16 * depth[i]) + "px";
      var tog = el("span", "tog", children[i].length ? (open[i] || filter ? "\u25be" : "\u25b8") : "");
      if (children[i].length) {
        var toggle = function () { open[i] = !open[i]; renderTree(); };
        tog.addEventListener("click", toggle);
        activates(tog, function () { toggle(); var again = tbody.querySelector("tr[data-path='" + CSS.escape(str(M.path[i])) + "'] .tog"); if (again) again.focus(); },
          (open[i] ? "collapse " : "expand ") + (str(M.path[i]) || "(root)"));
        tog.setAttribute("aria-expanded", open[i] || filter ? "true" : "false");
      }
      name.appendChild(tog);
      name.appendChild(el("span", null, i === 0 ? (str(M.path[i]) || "(root)") : str(M.path[i]).split(".").pop()));
      tr.appendChild(name);
      tr.appendChild(el("td", "l type", str(M.type[i])));
      tr.appendChild(el("td", null, M.recompute && M.recompute[i] ? M.calls[i] + "+" + M.recompute[i] + "r" : M.calls[i]));
      tr.appendChild(el("td", "l shape", M.out && M.out[i] >= 0 ? str(M.out[i]) : ""));
      tr.appendChild(el("td", null, time(val(i, "self_cpu_us"))));
      tr.appendChild(el("td", null, time(val(i, "cpu_us"))));
      tr.appendChild(el("td", null, time(val(i, "device_us"))));
      tr.appendChild(el("td", null, bytes(val(i, "cpu_alloc_bytes") + val(i, "device_alloc_bytes"))));
      tr.appendChild(el("td", null, bytes(val(i, "net_bytes"))));
      tr.appendChild(el("td", null, si(val(i, "flops"))));
      tr.appendChild(el("td", null, rate(i) ? si(rate(i)) + "/s" : ""));
      tr.appendChild(el("td", null, si(M.params[i])));
      var share = el("td", null, (100 * val(i, shareField) / whole).toFixed(1) + "%");
      var bar = el("span", "bar"); bar.style.width = Math.round(60 * val(i, shareField) / whole) + "px";
      share.appendChild(bar); tr.appendChild(share);
      tbody.appendChild(tr);
      if (!(open[i] || filter)) return;
      var kids = order0[i].slice();
      if (sortKey) kids.sort(function (a, b) { var d = cellValue(a, sortKey) - cellValue(b, sortKey); return sortAsc ? d : -d; });
      kids.forEach(walk);
    })(0);
  }
  document.querySelectorAll("#phase button").forEach(function (b) {
    b.addEventListener("click", function () {
      phase = b.dataset.phase;
      document.querySelectorAll("#phase button").forEach(function (x) { x.classList.toggle("on", x === b); });
      renderTree();
    });
  });
  document.getElementById("treefilter").addEventListener("input", function (e) { filter = e.target.value.toLowerCase(); renderTree(); });
  renderTree();

  // ----- flame charts -------------------------------------------------------------------------
  var pick = document.getElementById("flamemetric"), framesPick = document.getElementById("flameframes");
  function showFlame() {
    var frames = framesPick ? framesPick.value : "modules";
    document.querySelectorAll(".flame").forEach(function (f) {
      f.style.display = f.dataset.metric === pick.value && f.dataset.frames === frames ? "" : "none";
    });
  }
  pick.addEventListener("change", showFlame);
  if (framesPick) framesPick.addEventListener("change", showFlame);
  showFlame();

  // ----- ops ----------------------------------------------------------------------------------
  var O = D.ops, opSort = "self_cpu_us", opAsc = false, opFilter = "", group = "name";
  var OCOLS = [["Op", "name"], ["Phase", "phase"], ["Module", "module"], ["Input shapes", "shapes"], ["Calls", "calls"],
               ["Self CPU", "self_cpu_us"], ["CPU total", "cpu_us"], ["Self device", "self_device_us"],
               ["Alloc", "cpu_alloc_bytes"], ["FLOPs", "flops"]];
  var textCols = 4;
  if (O.stack) { OCOLS.splice(4, 0, ["Source location", "source"]); textCols = 5; }
  var ohead = document.querySelector("#ops thead tr"), obody = document.querySelector("#ops tbody");
  OCOLS.forEach(function (c, k) {
    var th = el("th", k < textCols ? "l" : "", c[0]);
    var sortOps = function () { if (opSort === c[1]) opAsc = !opAsc; else { opSort = c[1]; opAsc = false; } renderOps(); };
    th.addEventListener("click", sortOps); activates(th, sortOps, "sort ops by " + c[0]);
    ohead.appendChild(th);
  });
  function renderOps() {
    var rows = {}, keys = [];
    for (var r = 0; r < O.name.length; r++) {
      var name = str(O.name[r]), module = O.module[r] >= 0 ? str(O.module[r]) : "[" + str(O.scope[r]) + "]";
      if (opFilter && (name + " " + module).toLowerCase().indexOf(opFilter) < 0) continue;
      var source = O.stack ? str(O.stack[r]) : "";
      var key = name + (group === "shapes" ? "\u0000" + str(O.shapes[r]) : group === "module" ? "\u0000" + module :
                        group === "source" ? "\u0000" + source : "");
      var row = rows[key];
      if (!row) { row = rows[key] = {name: name, phase: str(O.phase[r]), module: group === "module" ? module : "", shapes: group === "shapes" ? str(O.shapes[r]) : "", source: group === "source" ? source : "", calls: 0, m: new Array(F.length).fill(0)}; keys.push(key); }
      if (row.phase !== str(O.phase[r])) row.phase = "";
      row.calls += O.calls[r];
      for (var f = 0; f < O.m[r].length; f++) row.m[f] += O.m[r][f];  // trailing zeros left out
    }
    var list = keys.map(function (k) { return rows[k]; });
    function get(x, key) { return key in FI ? (key === "cpu_alloc_bytes" ? x.m[FI.cpu_alloc_bytes] + x.m[FI.device_alloc_bytes] : x.m[FI[key]]) : x[key]; }
    list.sort(function (a, b) {
      var va = get(a, opSort), vb = get(b, opSort), d = typeof va === "string" ? String(va).localeCompare(vb) : va - vb;
      return opAsc ? d : -d;
    });
    obody.textContent = "";
    list.slice(0, 300).forEach(function (x) {
      var tr = el("tr");
      tr.appendChild(el("td", "l", x.name)); tr.appendChild(el("td", "l", x.phase || ""));
      tr.appendChild(el("td", "l", x.module)); tr.appendChild(el("td", "l", x.shapes));
      if (O.stack) { var src = el("td", "l src", x.source); tr.appendChild(src); }
      tr.appendChild(el("td", null, x.calls)); tr.appendChild(el("td", null, time(get(x, "self_cpu_us"))));
      tr.appendChild(el("td", null, time(get(x, "cpu_us")))); tr.appendChild(el("td", null, time(get(x, "self_device_us"))));
      tr.appendChild(el("td", null, bytes(get(x, "cpu_alloc_bytes")))); tr.appendChild(el("td", null, si(get(x, "flops"))));
      obody.appendChild(tr);
    });
    document.getElementById("opcount").textContent = list.length + " rows" + (list.length > 300 ? " (first 300 shown)" : "");
  }
  document.getElementById("opgroup").addEventListener("change", function (e) { group = e.target.value; renderOps(); });
  document.getElementById("opfilter").addEventListener("input", function (e) { opFilter = e.target.value.toLowerCase(); renderOps(); });
  renderOps();

  // ----- annotated source ---------------------------------------------------------------------
  // Each file's listing: the lines of its windows and the lines with figures, in order, a gap row
  // where lines are skipped; every cell (source text included) is set through textContent.
  var SRC = D.source;
  function sum(a) { var t = 0; for (var k = 0; k < a.length; k++) t += a[k]; return t; }
  function sharePct(t, total) { return t > 0 ? (100 * t / total).toFixed(1) + "%" : ""; }
  if (SRC) {
    var srcTotal = SRC.total || 1, heaviest = 0;
    SRC.files.forEach(function (f) { f.fwd.forEach(function (v, k) { heaviest = Math.max(heaviest, v + f.bwd[k]); }); });
    var fhead = document.querySelector("#sourcefiles thead tr"), fbody = document.querySelector("#sourcefiles tbody");
    ["File", "Forward", "Backward", "FLOPs", "Share", "Module"].forEach(function (h, k) { fhead.appendChild(el("th", k === 0 || k === 5 ? "l" : "", h)); });
    var overview = function (cls, label, fwd, bwd, flops, module) {
      var tr = el("tr", cls);
      tr.appendChild(el("td", "l src", label));
      [time(fwd), time(bwd), si(flops), sharePct(fwd + bwd, srcTotal)].forEach(function (v) { tr.appendChild(el("td", null, v)); });
      tr.appendChild(el("td", "l", module));
      fbody.appendChild(tr);
    };
    SRC.files.forEach(function (f) { overview("file", f.path + (f.note ? " (" + f.note + ")" : ""), sum(f.fwd), sum(f.bwd), sum(f.flops), ""); });
    if (SRC.more) overview("more", SRC.more.files + " more files", SRC.more.fwd, SRC.more.bwd, SRC.more.flops, "");
    if (SRC.no_line) overview("noline", SRC.no_line.label + ": ops no line of your code called", SRC.no_line.fwd, SRC.no_line.bwd, SRC.no_line.flops, SRC.no_line.module);
    var listing = function (f) {
      var table = el("table", "listing"), head = el("tr"), body = el("tbody"), text = {}, at = {}, shown = {};
      ["Line", "Forward", "Backward", "FLOPs", "Share", "Module", "Source"].forEach(function (h, k) { head.appendChild(el("th", k >= 5 ? "l" : "", h)); });
      var thead = el("thead"); thead.appendChild(head); table.appendChild(thead); table.appendChild(body);
      f.windows.forEach(function (w) { w[1].forEach(function (t, k) { text[w[0] + k] = t; shown[w[0] + k] = 1; }); });
      f.lines.forEach(function (ln, k) { at[ln] = k; shown[ln] = 1; });
      var prev = 0;
      Object.keys(shown).map(Number).sort(function (a, b) { return a - b; }).forEach(function (ln) {
        if (ln > prev + 1) { var gap = el("tr", "gap"); var td = el("td", "l", "\u22ef " + (ln - prev - 1) + " lines"); td.colSpan = 7; gap.appendChild(td); body.appendChild(gap); }
        prev = ln;
        var k = at[ln], tr = el("tr", k === undefined ? "" : "fig");
        tr.dataset.line = ln;
        tr.appendChild(el("td", "ln", ln));
        if (k === undefined) { for (var c = 0; c < 5; c++) tr.appendChild(el("td")); } else {
          var t = f.fwd[k] + f.bwd[k];
          [time(f.fwd[k]), time(f.bwd[k]), si(f.flops[k]), sharePct(t, srcTotal)].forEach(function (v) { tr.appendChild(el("td", null, v)); });
          tr.appendChild(el("td", "l", f.module[k]));
          tr.title = f["function"][k] + ": " + f.calls[k] + " calls";
          // the heat: proportional to the line's share, the heaviest line of the section darkest
          if (t > 0 && heaviest > 0) tr.style.backgroundColor = "rgba(240, 110, 30, " + (0.7 * t / heaviest).toFixed(3) + ")";
        }
        tr.appendChild(el("td", "l code", ln in text ? text[ln] : ""));
        body.appendChild(tr);
      });
      return table;
    };
    var srcList = document.getElementById("sourcelist");
    SRC.files.forEach(function (f, i) {
      var box = el("details", "srcfile"), summary = el("summary");
      box.open = i < 3;  // the three heaviest open; the rest one click away
      summary.appendChild(el("span", "src", f.path));
      summary.appendChild(el("span", "muted", "  " + time(sum(f.fwd) + sum(f.bwd)) + " \u00b7 " + sharePct(sum(f.fwd) + sum(f.bwd), srcTotal)));
      if (f.note) summary.appendChild(el("span", "note", "  " + f.note));
      box.appendChild(summary);
      var wrap = el("div", "scroll"); wrap.appendChild(listing(f)); box.appendChild(wrap);
      srcList.appendChild(box);
    });
  }

  // ----- memory -------------------------------------------------------------------------------
  var mem = D.memory, plot = document.getElementById("memplot");
  if (!plot) {
    // the chart by category is drawn with the page
  } else if (mem && mem.t_us.length) {
    var NS = "http://www.w3.org/2000/svg", W = 1100, H = 220, P = 70;
    var ys = mem.device_net_bytes.length ? mem.device_net_bytes : mem.cpu_net_bytes;
    var tmax = Math.max.apply(null, mem.t_us) || 1, ymax = Math.max.apply(null, ys) || 1, ymin = Math.min(0, Math.min.apply(null, ys));
    var svg = document.createElementNS(NS, "svg"); svg.setAttribute("width", W); svg.setAttribute("height", H + 34);
    function X(t) { return P + (W - 2 * P) * t / tmax; }
    function Y(v) { return H - (H - 20) * (v - ymin) / (ymax - ymin || 1); }
    var pts = mem.t_us.map(function (t, k) { return X(t).toFixed(1) + "," + Y(ys[k]).toFixed(1); }).join(" ");
    var line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", pts); line.setAttribute("fill", "none"); line.setAttribute("stroke", "#1570a6"); line.setAttribute("stroke-width", "1.5");
    svg.appendChild(line);
    var dot = document.createElementNS(NS, "circle");
    dot.setAttribute("cx", X(mem.peak.t_us)); dot.setAttribute("cy", Y(mem.peak.relative_peak_bytes)); dot.setAttribute("r", 5); dot.setAttribute("fill", "#b42318");
    svg.appendChild(dot);
    var label = document.createElementNS(NS, "text");
    label.setAttribute("x", Math.min(X(mem.peak.t_us) + 8, W - 360)); label.setAttribute("y", Math.max(Y(mem.peak.relative_peak_bytes) - 6, 12));
    label.setAttribute("font-size", "12");
    label.textContent = "peak " + bytes(mem.peak.relative_peak_bytes) + " in " + (mem.peak.module || "(root)") + (mem.peak.phase ? " (" + mem.peak.phase + ")" : "");
    svg.appendChild(label);
    // light gridlines with their values: bytes on the left, time along the bottom
    function tick(x, y, anchor, text) {
      var t = document.createElementNS(NS, "text");
      t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("font-size", "10");
      t.setAttribute("fill", "#667085"); t.setAttribute("text-anchor", anchor);
      t.textContent = text; svg.appendChild(t);
    }
    [ymin, (ymin + ymax) / 2, ymax].forEach(function (v) {
      var g = document.createElementNS(NS, "line");
      g.setAttribute("x1", P); g.setAttribute("x2", W - P); g.setAttribute("y1", Y(v)); g.setAttribute("y2", Y(v));
      g.setAttribute("stroke", "#eef0f3"); svg.insertBefore(g, line);
      tick(P - 4, Y(v) + 3, "end", v === 0 ? "0 B" : bytes(v));
    });
    [0, 0.25, 0.5, 0.75, 1].forEach(function (f) { tick(X(f * tmax), H + 10, "middle", f === 0 ? "0" : time(f * tmax)); });
    var axis = document.createElementNS(NS, "text");
    axis.setAttribute("x", P); axis.setAttribute("y", H + 26); axis.setAttribute("font-size", "11"); axis.setAttribute("fill", "#667085");
    axis.textContent = (mem.device_net_bytes.length ? "device" : "CPU") + " memory allocated (net) since the window began, over " + time(tmax);
    svg.appendChild(axis);
    plot.appendChild(svg);
  } else {
    plot.appendChild(el("p", "muted", "No memory events in this profile (profile with memory=True or --memory)."));
  }
  var mbody = document.querySelector("#memtable tbody"), idx = [];
  for (i = 0; i < n; i++) if (!children[i].length) idx.push(i);
  idx.sort(function (a, b) { return (M.fwd[b][FI.cpu_alloc_bytes] + M.fwd[b][FI.device_alloc_bytes]) - (M.fwd[a][FI.cpu_alloc_bytes] + M.fwd[a][FI.device_alloc_bytes]); });
  idx.slice(0, 15).forEach(function (k) {
    var tr = el("tr");
    tr.appendChild(el("td", "l", str(M.path[k]) || "(root)"));
    tr.appendChild(el("td", null, bytes(M.fwd[k][FI.cpu_alloc_bytes] + M.fwd[k][FI.device_alloc_bytes])));
    tr.appendChild(el("td", null, bytes(M.fwd[k][FI.net_bytes])));
    tr.appendChild(el("td", null, bytes(Math.max(M.fwd[k][FI.cpu_relative_peak_bytes], M.fwd[k][FI.device_relative_peak_bytes]))));
    mbody.appendChild(tr);
  });

  // ----- steps --------------------------------------------------------------------------------
  var steps = document.getElementById("steps"), stepTree = document.getElementById("steptree");
  function showStep(g) {
    var step = g.dataset.step, mods = D.step_trees[step] || [];
    document.querySelectorAll("#stepchart g.chosen").forEach(function (x) { x.classList.remove("chosen"); });
    g.classList.add("chosen");
    stepTree.textContent = ""; stepTree.className = "";
    stepTree.appendChild(el("h3", null, "Step " + step + ": its heaviest modules"));
    var table = el("table"), head = el("tr");
    ["Module", "Forward", "Backward"].forEach(function (h, k) { head.appendChild(el("th", k ? null : "l", h)); });
    table.appendChild(el("thead")).appendChild(head);
    var body = el("tbody");
    mods.forEach(function (m) {
      var tr = el("tr"), path = str(m[0]), name = el("td", "l", path);
      name.style.paddingLeft = (8 + 16 * (path.split(".").length - 1)) + "px";
      tr.appendChild(name); tr.appendChild(el("td", null, time(m[1]))); tr.appendChild(el("td", null, time(m[2])));
      body.appendChild(tr);
    });
    table.appendChild(body); stepTree.appendChild(table);
  }
  document.querySelectorAll("#stepchart g[data-step]").forEach(function (g) {
    g.addEventListener("click", function () { showStep(g); });
    g.addEventListener("keydown", function (e) { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); showStep(g); } });
  });
  if (D.steps.length > 1) {
    var sbody = steps.querySelector("tbody");
    D.steps.forEach(function (s) {
      var tr = el("tr", s[6] ? "outlier" : "");
      [s[0], time(s[1]), time(s[2]), time(s[3]), time(s[4]), time(s[5]), s[7] || ""].forEach(function (v, k) { tr.appendChild(el("td", k === 6 ? "l" : null, v)); });
      sbody.appendChild(tr);
    });
  } else {
    steps.style.display = "none";
  }
})();
