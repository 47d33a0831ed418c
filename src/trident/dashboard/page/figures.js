// A page of figures written as one file by `trident bench comm --html`, `trident plan --html` and `trident
// simulate --html` (dashboard/page_file.h): the figures come inlined as window.TRIDENT_FIGURES =
//   {title, subtitle, notes: [text], figures: [figure], tables: [{title, columns, rows}]}
// where a figure is {id, title, type: "line", xlabel, ylabel, logx, logy, xformat: "bytes"|"number",
// series: [{label, x, y, dash, count}]} or {id, title, type: "bars", xlabel, ylabel, labels, parts:
// [{label, values}], lines: [{label, values}]}. Drawn with charts.js (the dashboard's own chart code); each
// figure's container is #fig-<id> and carries charts.js's data-* attributes for the browser tests.
(function () {
  "use strict";
  const spec = window.TRIDENT_FIGURES || {figures: []};
  const {palette, esc, plot, bars} = window.TridentCharts;
  const $ = (id) => document.getElementById(id);

  // 1, 2, ..., 512, 1K, ..., 4M: sizes in powers of 1024 as the benchmark's flags take them.
  function bytes(n) {
    for (const [unit, div] of [["G", 1 << 30], ["M", 1 << 20], ["K", 1 << 10]])
      if (n >= div) return `${+(n / div).toPrecision(3)}${unit}`;
    return `${+Number(n).toPrecision(3)}`;
  }

  document.title = spec.title || "trident";
  $("title").textContent = spec.title || "";
  $("subtitle").textContent = spec.subtitle || "";
  $("notes").innerHTML = (spec.notes || []).map((n) => `<p class="note">${esc(n)}</p>`).join("");
  const figs = spec.figures || [];
  $("figures").innerHTML = figs.map((f) =>
    `<div class="chart"><h2>${esc(f.title || "")}</h2><div id="fig-${esc(f.id)}" class="plot"></div></div>`).join("");
  for (const f of figs) {
    const id = "fig-" + f.id;
    if (f.type === "bars") {
      bars(id, f.labels || [], (f.parts || []).map((p, k) => ({label: p.label, values: p.values, color: palette[k % palette.length]})),
           f.lines || [], {xlabel: f.xlabel, ylabel: f.ylabel, height: 340});
      continue;
    }
    const series = (f.series || []).map((s, k) => ({label: s.label, x: s.x, y: s.y, color: palette[k % palette.length],
                                                    dash: s.dash ? [6, 4] : undefined, marks: true, count: true}));
    plot(id, series, {xlabel: f.xlabel, ylabel: f.ylabel, logx: !!f.logx, log: !!f.logy, height: 340,
                      xvalue: f.xformat === "bytes" ? bytes : undefined, empty: "no data"});
  }
  $("tables").innerHTML = (spec.tables || []).map((t) => {
    let h = `<h2>${esc(t.title || "")}</h2><table class="figure-table"><tr>` + t.columns.map((c) => `<th>${esc(c)}</th>`).join("") + "</tr>";
    for (const r of t.rows) h += "<tr>" + r.map((c, i) => `<td class="${i ? "" : "text"}">${esc(c)}</td>`).join("") + "</tr>";
    return h + "</table>";
  }).join("");
  document.body.dataset.figures = figs.map((f) => f.id).join("|");
  document.body.dataset.ready = "1";
})();
