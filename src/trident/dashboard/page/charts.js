// uPlot helpers shared by the dashboard page (dashboard.js) and the figure pages that `trident bench comm
// --html`, `trident plan --html` and `trident simulate --html` write (figures.js): line charts over series
// aligned on their x values, and stacked bars. Each chart container records what it drew in data-*
// attributes that the headless-browser tests read: data-series (the legend's labels, "|"-separated),
// data-points (the points of each series flagged `count`) and, for bars, data-bars (the bar count).
window.TridentCharts = (function () {
  "use strict";
  const palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                   "#bcbd22", "#7f7f7f", "#aec7e8", "#ff9896", "#98df8a", "#ffbb78", "#c5b0d5", "#c49c94"];
  const charts = {};  // container id -> {plot, key}

  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  }
  function fmt(x, digits) {
    if (x === null || x === undefined || !isFinite(x)) return "–";
    return Number(x).toFixed(digits === undefined ? 3 : digits);
  }

  // Aligns several (x[], y[]) series on the union of their x values, as uPlot wants (null: no point).
  function align(series) {
    const xs = new Set();
    for (const s of series) for (const x of s.x) if (x !== null && x !== undefined) xs.add(x);
    const xsorted = Array.from(xs).sort((a, b) => a - b);
    const data = [xsorted];
    for (const s of series) {
      const m = new Map();
      s.x.forEach((x, i) => { if (s.y[i] !== null && s.y[i] !== undefined && isFinite(s.y[i])) m.set(x, s.y[i]); });
      data.push(xsorted.map((x) => (m.has(x) ? m.get(x) : null)));
    }
    return data;
  }

  function drop(id) {
    if (charts[id]) { charts[id].plot.destroy(); delete charts[id]; }
  }

  // Draws (or updates) one line chart in the element `id`: series [{label, x, y, color, dash, points, count}].
  // opts: xlabel, ylabel, log (y on a log10 scale), logx (x on a log2 scale), xvalue (tick text of an x
  // value), height, empty (the text shown when no series has a point).
  function plot(id, series, opts) {
    const el = document.getElementById(id);
    opts = opts || {};
    if (!series.length || series.every((s) => !s.y.some((v) => v !== null && v !== undefined))) {
      drop(id);
      el.innerHTML = `<div class="empty">${esc(opts.empty || "no data in these runs")}</div>`;
      return;
    }
    const data = align(series);
    const key = JSON.stringify([series.map((s) => s.label), opts.log, opts.logx, opts.xlabel]);
    const width = Math.max(400, el.clientWidth || 560);
    if (charts[id] && charts[id].key === key) {
      charts[id].plot.setData(data);
    } else {
      drop(id);
      el.innerHTML = "";
      const xaxis = {label: opts.xlabel || "step"};
      // uPlot passes null for the ticks a log scale leaves unlabelled.
      if (opts.xvalue) xaxis.values = (u, ticks) => ticks.map((t) => (t === null ? "" : opts.xvalue(t)));
      const uopts = {
        width: width, height: opts.height || 300,
        scales: {x: opts.logx ? {time: false, distr: 3, log: 2} : {time: false}, y: opts.log ? {distr: 3} : {}},
        axes: [xaxis, {label: opts.ylabel || ""}],
        series: [{label: opts.xlabel || "step", value: opts.xvalue ? (u, v) => (v === null ? "–" : opts.xvalue(v)) : undefined}]
          .concat(series.map((s) => ({
            label: s.label, stroke: s.color, width: s.points ? 0 : 1.5, dash: s.dash, spanGaps: true,
            paths: s.points ? () => null : undefined,
            points: s.points ? {show: true, size: 9, fill: s.color, stroke: s.color}
                             : {show: !!s.marks, size: 5, stroke: s.color, fill: s.color},
          }))),
        legend: {show: true},
      };
      charts[id] = {plot: new uPlot(uopts, data, el), key: key};
    }
    el.dataset.series = series.map((s) => s.label).join("|");
    el.dataset.points = series.filter((s) => s.count).map((s) => s.y.filter((v) => v !== null && v !== undefined).length).join(",");
  }

  // Stacked bars in the element `id`, one bar per label: parts [{label, color, values}] (one value per bar,
  // stacked in order), and an optional line [{label, values}] drawn over them (a prediction, a total).
  // uPlot draws bars, not stacks: each bar is the cumulative sum up to its part, drawn from the tallest
  // down so every part shows in its own colour. opts: xlabel, ylabel, empty, height.
  function bars(id, labels, parts, lines, opts) {
    const el = document.getElementById(id);
    opts = opts || {};
    drop(id);
    el.dataset.bars = String(labels.length);
    el.dataset.series = parts.map((p) => p.label).concat((lines || []).map((l) => l.label)).join("|");
    if (!labels.length) { el.innerHTML = `<div class="empty">${esc(opts.empty || "no data")}</div>`; return; }
    el.innerHTML = "";
    const sums = [];
    parts.forEach((p, k) => sums.push(p.values.map((v, i) => (k ? sums[k - 1][i] : 0) + (v || 0))));
    const xs = labels.map((_, i) => i);
    const drawBars = uPlot.paths.bars({size: [0.6, 80]});
    const order = parts.map((_, k) => k).reverse();  // the tallest cumulative bar first
    const series = [{label: opts.xlabel || ""}].concat(order.map((k) => ({
      label: parts[k].label, fill: parts[k].color, stroke: parts[k].color, width: 0, paths: drawBars, points: {show: false},
      value: (u, v, si, i) => (i === null || i === undefined ? "–" : fmt(sums[k][i] - (k ? sums[k - 1][i] : 0), 2)),
    }))).concat((lines || []).map((l, k) => ({label: l.label, stroke: l.color || "#000", dash: [8, 4], width: 1.5,
                                               points: {show: true, size: 7}})));
    const data = [xs].concat(order.map((k) => sums[k])).concat((lines || []).map((l) => l.values));
    const uopts = {
      width: Math.max(400, el.clientWidth || 560), height: opts.height || 300,
      scales: {x: {time: false, range: [-0.6, labels.length - 0.4]}, y: {range: (u, lo, hi) => [0, hi * 1.1 || 1]}},
      axes: [{label: opts.xlabel || "", splits: () => xs,
              values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) && labels[t] !== undefined ? labels[t] : ""))},
             {label: opts.ylabel || ""}],
      series: series, legend: {show: true},
    };
    charts[id] = {plot: new uPlot(uopts, data, el), key: ""};
  }

  return {palette: palette, charts: charts, esc: esc, fmt: fmt, align: align, plot: plot, bars: bars};
})();
