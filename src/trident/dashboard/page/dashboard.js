// The trident dashboard page: charts of training runs drawn with uPlot. Served by `trident dashboard`, it
// polls /api/runs and each run's /api/runs/<id>/records (the records since the last answer; a rewritten
// metrics file, after a restart, starts the run over). Written by `trident report`, the data comes inlined
// as window.TRIDENT_REPORT and nothing is fetched. Every chart container records what it drew in
// data-* attributes (data-points: the loss points per run), which the headless-browser test reads.
(function () {
  "use strict";
  const report = window.TRIDENT_REPORT || null;
  const palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
  const runs = [];  // {summary, generation, next, records}
  const charts = {};  // container id -> {plot, key}
  const $ = (id) => document.getElementById(id);

  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  }
  function fmt(x, digits) {
    if (x === null || x === undefined || !isFinite(x)) return "–";
    return Number(x).toFixed(digits === undefined ? 3 : digits);
  }
  function mb(bytes) { return bytes === undefined || bytes === null ? null : bytes / 1e6; }

  // What the page shows of one run, derived from its records.
  function derive(run) {
    const d = {steps: [], loss: [], tps: [], stepMs: [], exposedMs: [], rss: [], rssMax: [], gnorm: [],
               evals: [], health: [], prediction: null, measured: null, runRecs: []};
    let prev = null, evalBetween = false;
    for (const r of run.records) {
      switch (r.type) {
        case "step": {
          d.steps.push(r.step);
          d.loss.push(r.loss);
          d.tps.push(r.tokens_per_s);
          // Step time from consecutive records (the elapsed clock); the first step carries start-up and a
          // step after an evaluation carries the evaluation, so neither is a step time.
          d.stepMs.push(prev && r.step > prev.step && !evalBetween ? 1e3 * (r.elapsed - prev.elapsed) / (r.step - prev.step) : null);
          evalBetween = false;
          d.exposedMs.push(r.comm_exposed_s !== undefined ? 1e3 * r.comm_exposed_s : null);
          d.rss.push(mb(r.peak_rss_bytes));
          d.rssMax.push(mb(r.peak_rss_bytes_max_rank));
          d.gnorm.push(r.grad_norm);
          if (Array.isArray(r.health)) for (const e of r.health) d.health.push(Object.assign({step: r.step}, e));
          prev = r;
          break;
        }
        case "eval": d.evals.push(r); evalBetween = true; break;
        case "prediction": d.prediction = r; break;
        case "measured": d.measured = r; break;
        case "run": d.runRecs.push(r); break;
      }
    }
    return d;
  }

  function tokensPerStep(run) {
    const c = run.summary.checkpoint || {};
    if (!c.sampler || !c.model) return null;
    return c.sampler.global_batch * (c.sampler.accumulation || 1) * c.model.block_size;
  }

  function smooth(ys, w) {
    if (!w) return ys;
    let last = 0, n = 0;
    return ys.map((y) => {
      if (y === null || y === undefined || !isFinite(y)) return y;
      last = last * w + (1 - w) * y;
      n += 1;
      return last / (1 - Math.pow(w, n));
    });
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

  // Draws (or updates) one chart: series [{label, x, y, color, dash, points}].
  function plot(id, series, opts) {
    const el = $(id);
    opts = opts || {};
    if (!series.length || series.every((s) => !s.y.some((v) => v !== null && v !== undefined))) {
      if (charts[id]) { charts[id].plot.destroy(); delete charts[id]; }
      el.innerHTML = '<div class="empty">no data in these runs</div>';
      return;
    }
    const data = align(series);
    const key = JSON.stringify([series.map((s) => s.label), opts.log, opts.xlabel]);
    const width = Math.max(400, el.clientWidth || 560);
    if (charts[id] && charts[id].key === key) {
      charts[id].plot.setData(data);
    } else {
      if (charts[id]) charts[id].plot.destroy();
      el.innerHTML = "";
      const uopts = {
        width: width, height: 300,
        scales: {x: {time: false}, y: opts.log ? {distr: 3} : {}},
        axes: [{label: opts.xlabel || "step"}, {label: opts.ylabel || ""}],
        series: [{label: opts.xlabel || "step"}].concat(series.map((s) => ({
          label: s.label, stroke: s.color, width: s.points ? 0 : 1.5, dash: s.dash, spanGaps: true,
          paths: s.points ? () => null : undefined,
          points: s.points ? {show: true, size: 9, fill: s.color, stroke: s.color} : {show: false},
        }))),
        legend: {show: true},
      };
      charts[id] = {plot: new uPlot(uopts, data, el), key: key};
    }
    el.dataset.series = series.map((s) => s.label).join("|");
    el.dataset.points = series.filter((s) => s.count).map((s) => s.y.filter((v) => v !== null && v !== undefined).length).join(",");
  }

  function render() {
    const xmode = $("xaxis").value;
    const log = $("logscale").checked;
    const w = parseFloat($("smoothing").value) || 0;
    $("smoothing-value").textContent = w.toFixed(2);
    const all = runs.map((r) => ({run: r, d: derive(r)}));
    const lossS = [], speedS = [], timeS = [], memS = [], gnS = [];
    all.forEach(({run, d}, i) => {
      const name = run.summary.name;
      const color = palette[i % palette.length];
      let xs = d.steps, evx = d.evals.map((e) => e.step), hx = d.health.map((e) => e.step);
      if (xmode === "tokens") {
        const tps = tokensPerStep(run);
        const f = (s) => (tps === null ? null : (s + 1) * tps);
        xs = xs.map(f);
        evx = evx.map((s) => (tps === null ? null : s * tps));
        hx = hx.map(f);
      }
      lossS.push({label: name + " train", x: xs, y: smooth(d.loss, w), color: color, count: true});
      lossS.push({label: name + " val", x: evx, y: d.evals.map((e) => e.val_loss), color: color, dash: [6, 4]});
      const warnings = d.health.filter((e) => e.kind === "slow_link" || e.kind === "straggler");
      if (warnings.length) {
        const lossAt = new Map(d.steps.map((s, k) => [s, d.loss[k]]));
        lossS.push({label: name + " health warnings", x: hx.filter((_, k) => warnings.includes(d.health[k])),
                    y: d.health.filter((e) => warnings.includes(e)).map((e) => lossAt.get(e.step)),
                    color: "#000", points: true});
      }
      speedS.push({label: name, x: xs, y: d.tps, color: color});
      timeS.push({label: name + " step", x: xs, y: d.stepMs, color: color});
      if (d.exposedMs.some((v) => v !== null)) timeS.push({label: name + " exposed comm", x: xs, y: d.exposedMs, color: color, dash: [2, 3]});
      if (d.prediction && d.prediction.step_s)
        timeS.push({label: name + " predicted", x: xs, y: xs.map(() => 1e3 * d.prediction.step_s), color: color, dash: [8, 4]});
      memS.push({label: name + " rank 0", x: xs, y: d.rss, color: color});
      if (d.rssMax.some((v) => v !== null)) memS.push({label: name + " largest rank", x: xs, y: d.rssMax, color: color, dash: [2, 3]});
      if (d.prediction && d.prediction.peak_rss_bytes)
        memS.push({label: name + " predicted", x: xs, y: xs.map(() => mb(d.prediction.peak_rss_bytes)), color: color, dash: [8, 4]});
      gnS.push({label: name, x: xs, y: d.gnorm, color: color});
    });
    const xlabel = xmode === "tokens" ? "tokens" : "step";
    plot("chart-loss", lossS, {log: log, xlabel: xlabel, ylabel: "loss"});
    plot("chart-speed", speedS, {xlabel: xlabel, ylabel: "tokens/s"});
    plot("chart-steptime", timeS, {xlabel: xlabel, ylabel: "ms"});
    plot("chart-memory", memS, {xlabel: xlabel, ylabel: "MB"});
    plot("chart-gradnorm", gnS, {xlabel: xlabel, ylabel: "norm"});
    renderTable(all);
    renderHealth(all);
    renderConfig(all);
    renderInspect(all);
    document.body.dataset.runs = all.map(({run}) => run.summary.name).join("|");
    document.body.dataset.ready = "1";
  }

  function median(xs) {
    const v = xs.filter((x) => x !== null && isFinite(x)).sort((a, b) => a - b);
    return v.length ? v[Math.floor(v.length / 2)] : null;
  }

  function renderTable(all) {
    const rows = all.map(({run, d}, i) => {
      const s = run.summary;
      const last = (a) => (a.length ? a[a.length - 1] : null);
      const lastEval = last(d.evals);
      const stepMs = median(d.stepMs.slice(-20));
      const p = d.prediction || {};
      const mfu = p.peak_flops && p.model_flops_per_step && stepMs ? p.model_flops_per_step / (stepMs / 1e3) / p.peak_flops : null;
      const m = (s.checkpoint || {}).model;
      const model = m ? `${m.kind} ${m.n_layer}L ${m.n_embd}d ${m.n_head}h ${m.dtype}` : "–";
      const layout = p.layout ? `tp ${p.layout.tp} pp ${p.layout.pp} dp ${p.layout.dp}` : (p.parallel ? `${p.parallel} x${p.world}` : "–");
      return `<tr data-run="${esc(s.name)}"><td class="name" style="color:${palette[i % palette.length]}">${esc(s.name)}<br><small>${esc(s.dir)}</small></td>` +
        `<td class="status-${esc(s.status)}">${esc(s.status)}</td><td>${s.restarts}</td><td>${s.steps}</td>` +
        `<td>${fmt(last(d.loss))}</td><td>${fmt(lastEval ? lastEval.val_loss : null)}</td><td>${fmt(last(d.tps), 0)}</td>` +
        `<td>${fmt(stepMs, 1)}</td><td>${fmt(p.step_s ? 1e3 * p.step_s : null, 1)}</td><td>${mfu === null ? "–" : fmt(100 * mfu, 1) + "%"}</td>` +
        `<td>${fmt(last(d.rss), 1)} MB</td><td class="text">${esc(layout)}</td><td class="text">${esc(model)}</td></tr>`;
    });
    document.querySelector("#runs tbody").innerHTML = rows.join("");
  }

  // Colour of a link at `ratio` of its baseline bandwidth: red at 0, yellow at 0.5, green at 1.
  function ratioColor(r) {
    const x = Math.max(0, Math.min(1, r));
    const hue = Math.round(120 * x);
    return `hsl(${hue}, 70%, 42%)`;
  }

  function renderHealth(all) {
    const html = all.map(({run, d}) => {
      const world = (d.prediction && d.prediction.world) || 1 + d.health.reduce((m, e) => Math.max(m, e.src || 0, e.dst || 0, e.rank || 0), 0);
      const links = new Map();  // "src,dst" -> latest event
      const late = new Map();   // rank -> latest event
      for (const e of d.health) {
        if (e.kind === "slow_link" || e.kind === "link_recovered") links.set(`${e.src},${e.dst}`, e);
        else late.set(e.rank, e);
      }
      let t = `<div class="run-block"><b>${esc(run.summary.name)}</b>`;
      if (world < 2) return t + '<div class="empty">one rank: no links to watch</div></div>';
      t += `<table class="matrix" data-run="${esc(run.summary.name)}"><tr><th>from \\ to</th>`;
      for (let c = 0; c < world; c++) t += `<th>${c}</th>`;
      t += "</tr>";
      for (let r = 0; r < world; r++) {
        t += `<tr><th>${r}</th>`;
        for (let c = 0; c < world; c++) {
          const e = links.get(`${r},${c}`);
          if (r === c) t += '<td class="self"></td>';
          else if (!e) t += `<td class="ok" data-link="${r}-${c}">ok</td>`;
          else {
            const cls = e.kind === "slow_link" ? "slow" : "recovered";
            t += `<td class="${cls}" data-link="${r}-${c}" style="background:${ratioColor(e.ratio)}" title="${esc(e.message)}">${fmt(e.ratio, 2)}x</td>`;
          }
        }
        t += "</tr>";
      }
      t += "</table>";
      if (late.size) {
        t += "<table><tr><th>rank</th><th>state</th><th>late ms</th><th>of collectives</th><th>since step</th></tr>";
        for (const [rank, e] of late)
          t += `<tr><td>${rank}</td><td class="text">${e.kind === "straggler" ? "late" : "recovered"}</td><td>${fmt(e.late_ms, 1)}</td>` +
               `<td>${fmt(100 * e.late_fraction, 0)}%</td><td>${e.since_step}</td></tr>`;
        t += "</table>";
      }
      if (d.health.length)
        t += "<pre>" + d.health.map((e) => `step ${e.step}: ${esc(e.message)}`).join("\n") + "</pre>";
      else t += '<div class="empty">no health warnings</div>';
      return t + "</div>";
    });
    $("health").innerHTML = html.join("");
  }

  // The rank -> (tp, dp, pp) coordinates of the mesh, in trident's default order (tp innermost, pp outermost).
  function meshTable(layout) {
    const tp = layout.tp || 1, dp = layout.dp || 1, pp = layout.pp || 1;
    let t = "<table><tr><th>rank</th><th>tp</th><th>dp</th><th>pp</th></tr>";
    for (let r = 0; r < tp * dp * pp && r < 512; r++)
      t += `<tr><td>${r}</td><td>${r % tp}</td><td>${Math.floor(r / tp) % dp}</td><td>${Math.floor(r / (tp * dp))}</td></tr>`;
    return t + "</table>";
  }

  function renderConfig(all) {
    $("config").innerHTML = all.map(({run, d}) => {
      const s = run.summary;
      const p = d.prediction || {};
      let layout = p.layout || null;
      if (!layout && p.world) layout = {tp: 1, pp: 1, dp: p.world};
      let t = `<div class="run-block"><b>${esc(s.name)}</b> <span class="status-${esc(s.status)}">${esc(s.status)}</span>`;
      if (s.restarts) t += ` (restarted ${s.restarts}x)`;
      if (layout) t += meshTable(layout);
      const facts = {};
      if (p.parallel) facts.parallel = p.parallel;
      if (p.world) facts.world = p.world;
      const rr = d.runRecs[d.runRecs.length - 1];
      if (rr) for (const k of ["cpu_isa", "threads", "device"]) if (rr[k] !== undefined) facts[k] = rr[k];
      const c = s.checkpoint || {};
      t += "<pre>" + esc(JSON.stringify(Object.assign(facts, {checkpoint: c.name, step: c.step, model: c.model, sampler: c.sampler}), null, 1)) + "</pre>";
      return t + "</div>";
    }).join("");
  }

  function renderInspect(all) {
    const parts = all.filter(({run}) => run.summary.inspect).map(({run}) =>
      `<div><b>${esc(run.summary.name)}</b> (trident inspect ${esc(run.summary.dir)})<pre>${esc(run.summary.inspect)}</pre></div>`);
    $("inspect").innerHTML = parts.length ? parts.join("") : '<div class="empty">no flight-recorder dumps (written when a run fails or hangs)</div>';
  }

  async function poll() {
    try {
      const answer = await (await fetch("/api/runs", {cache: "no-store"})).json();
      for (const s of answer.runs) {
        let run = runs[s.id];
        if (!run) run = runs[s.id] = {summary: s, generation: 0, next: 0, records: []};
        run.summary = s;
        const q = `/api/runs/${s.id}/records?generation=${run.generation}&from=${run.next}`;
        const j = await (await fetch(q, {cache: "no-store"})).json();
        if (j.reset) run.records = [];
        for (const r of j.records) run.records.push(r);
        run.generation = j.generation;
        run.next = j.next;
      }
      uniqueNames();
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      render();
    } catch (e) {
      $("updated").textContent = "dashboard server unreachable: " + e;
    }
    setTimeout(poll, 1000);
  }

  // The controls live in the URL's fragment too (#x=tokens&log=1&smooth=0.6), so a link shows the same view.
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("x") === "tokens") $("xaxis").value = "tokens";
  if (hash.get("log") === "1") $("logscale").checked = true;
  if (hash.has("smooth")) $("smoothing").value = String(Math.min(0.99, Math.max(0, parseFloat(hash.get("smooth")) || 0)));
  for (const id of ["xaxis", "logscale", "smoothing"])
    $(id).addEventListener("input", () => {
      const h = new URLSearchParams({x: $("xaxis").value, log: $("logscale").checked ? "1" : "0", smooth: $("smoothing").value});
      history.replaceState(null, "", "#" + h.toString());
      render();
    });
  // Two runs whose folders share a name are told apart by their index.
  function uniqueNames() {
    const seen = new Map();
    for (const r of runs) if (r) seen.set(r.summary.name, (seen.get(r.summary.name) || 0) + 1);
    for (const r of runs) if (r && seen.get(r.summary.name) > 1) r.summary.name += " #" + r.summary.id;
  }
  if (report) {
    $("mode").textContent = "report";
    for (const r of report.runs) runs.push({summary: r, generation: r.data.generation, next: r.data.next, records: r.data.records});
    uniqueNames();
    render();
  } else {
    $("mode").textContent = "live";
    poll();
  }
})();
