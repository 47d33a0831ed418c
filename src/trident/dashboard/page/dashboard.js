// The trident dashboard page: charts of training runs drawn with uPlot. Served by `trident dashboard`, it
// listens to /api/events (server-sent events: the runs' summaries and each run's new records; the browser
// resumes a dropped stream from the last event's id, and a rewritten metrics file, after a restart, starts
// the run over) and polls /api/runs and /api/runs/<id>/records only when the stream cannot be opened.
// Written by `trident report`, the data comes inlined as window.TRIDENT_REPORT and nothing is fetched.
// Every chart container records what it drew in data-* attributes (data-points: the loss points per run;
// data-bars: the per-rank bars of the step-time split; the link matrix's data-step and each cell's
// data-ratio), which the headless-browser test reads. The chart drawing is charts.js's (TridentCharts), shared
// with the figure pages of `trident bench comm --html` and `trident plan --html`. The health monitor's rounds (health.jsonl) come as
// "health" events, /api/runs/<id>/health or the report's runs[i].health.
(function () {
  "use strict";
  const report = window.TRIDENT_REPORT || null;
  const palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
  const runs = [];  // {summary, generation, next, records, health: {generation, next, records}}
  const healthPick = {};  // run index -> the health round shown in its link matrix (absent: the latest)
  const splitParts = ["compute", "comm", "bubble", "data", "optimizer"];
  const splitColors = ["#4e79a7", "#e15759", "#bab0ac", "#59a14f", "#f28e2b"];
  const {charts, esc, fmt, plot, bars} = window.TridentCharts;
  const $ = (id) => document.getElementById(id);
  function mb(bytes) { return bytes === undefined || bytes === null ? null : bytes / 1e6; }

  // What the page shows of one run, derived from its records.
  function derive(run) {
    const d = {steps: [], loss: [], tps: [], stepMs: [], exposedMs: [], rss: [], rssMax: [], gnorm: [],
               evals: [], health: [], prediction: null, measured: null, runRecs: [], split: [], mesh: null,
               rounds: run.health.records};
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
          // Where the step's time went, per rank (one rank: the record's own split).
          if (Array.isArray(r.time_ms_ranks)) d.split.push(r.time_ms_ranks);
          else if (r.time_ms) d.split.push([r.time_ms]);
          prev = r;
          break;
        }
        case "eval": d.evals.push(r); evalBetween = true; break;
        case "prediction": d.prediction = r; break;
        case "measured": d.measured = r; break;
        case "run": d.runRecs.push(r); break;
        case "mesh": d.mesh = r; break;
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
      // The health monitor's warnings, marked on the time axis at the value of the curve they interrupt.
      const warned = d.health.map((e) => e.kind === "slow_link" || e.kind === "straggler");
      const markers = (values) => {
        const at = new Map(d.steps.map((s, k) => [s, values[k]]));
        return {label: name + " health warnings", x: hx.filter((_, k) => warned[k]),
                y: d.health.filter((_, k) => warned[k]).map((e) => at.get(e.step)), color: "#000", points: true};
      };
      if (warned.includes(true)) lossS.push(markers(d.loss));
      speedS.push({label: name, x: xs, y: d.tps, color: color});
      if (warned.includes(true)) speedS.push(markers(d.tps));
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
    renderSplit(all);
    renderTable(all);
    renderLateness(all, xmode);
    renderHealth(all);
    renderConfig(all);
    renderInspect(all);
    document.body.dataset.runs = all.map(({run}) => run.summary.name).join("|");
    document.body.dataset.ready = "1";
  }

  // The step-time split per rank as stacked bars (the mean of each part over a run's last 20 steps that
  // have one, the first step left out: it carries start-up), one group of bars per run, beside the
  // planner's predicted step.
  function renderSplit(all) {
    const el = $("chart-split");
    const labels = [], means = splitParts.map(() => []), predicted = [], raw = [];
    all.forEach(({run, d}) => {
      const recent = d.split.slice(d.split.length > 1 ? Math.max(1, d.split.length - 20) : 0);
      if (!recent.length) return;
      const ranks = recent[recent.length - 1].length;
      for (let k = 0; k < ranks; k++) {
        const mean = splitParts.map((p) => {
          const v = recent.map((rs) => (rs[k] ? rs[k][p] : null))
            .filter((x) => x !== null && x !== undefined && isFinite(x));
          return v.length ? v.reduce((a, b) => a + b, 0) / v.length : 0;
        });
        labels.push(`${run.summary.name} r${k}`);
        mean.forEach((m, p) => means[p].push(m));
        raw.push(mean.map((m) => m.toFixed(3)).join(":"));
        predicted.push(d.prediction && d.prediction.step_s ? 1e3 * d.prediction.step_s : null);
      }
    });
    bars("chart-split", labels, splitParts.map((p, k) => ({label: p, color: splitColors[k], values: means[k]})),
         [{label: "predicted step", values: predicted}],
         {xlabel: "rank", ylabel: "ms per step", empty: "no step-time split in these runs"});
    el.dataset.split = raw.join("|");
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

  // Each rank's lateness at collectives per health round (ms summed over the step's collectives); a click
  // on the chart picks the round the link matrix shows.
  function renderLateness(all, xmode) {
    const series = [];
    all.forEach(({run, d}, i) => {
      const tps = xmode === "tokens" ? tokensPerStep(run) : null;
      const xs = d.rounds.map((h) => (xmode !== "tokens" ? h.step : tps === null ? null : (h.step + 1) * tps));
      const ranks = d.rounds.reduce((m, h) => Math.max(m, (h.ranks || []).length), 0);
      for (let k = 0; k < ranks; k++)
        series.push({label: `${run.summary.name} rank ${k}`, x: xs, count: true, color: palette[(i + k) % palette.length],
                     dash: k ? [2 + 2 * (k % 4), 3] : undefined,
                     y: d.rounds.map((h) => { const r = (h.ranks || []).find((x) => x.rank === k); return r ? r.late_ms : null; })});
    });
    plot("chart-late", series, {xlabel: xmode === "tokens" ? "tokens" : "step", ylabel: "ms late"});
    const c = charts["chart-late"];
    if (!c || c.clickBound) return;
    c.clickBound = true;
    c.plot.over.addEventListener("click", () => {
      const x = c.plot.posToVal(c.plot.cursor.left, "x");
      runs.forEach((run, i) => {
        const rounds = run.health.records;
        if (!rounds.length) return;
        let best = 0;
        rounds.forEach((h, k) => { if (Math.abs(h.step - x) < Math.abs(rounds[best].step - x)) best = k; });
        healthPick[i] = best === rounds.length - 1 ? undefined : best;
      });
      renderHealth(runs.map((r) => ({run: r, d: derive(r)})));
    });
  }

  // The link matrix of one run at its chosen round (default the latest): each cell the link from the row's
  // rank to the column's, its bandwidth as last measured at or before that round over its baseline; a link
  // the health monitor warned about (and has not recovered by then) is marked slow. A run without
  // health.jsonl shows the warnings alone.
  function renderHealth(all) {
    const html = all.map(({run, d}, i) => {
      const rounds = d.rounds;
      const pick = healthPick[i] !== undefined && healthPick[i] < rounds.length ? healthPick[i] : rounds.length - 1;
      const atStep = pick >= 0 ? rounds[pick].step : Infinity;
      let world = d.mesh ? d.mesh.ranks.length : (d.prediction && d.prediction.world) || 0;
      for (const h of rounds) for (const l of h.links || []) world = Math.max(world, l.src + 1, l.dst + 1);
      for (const e of d.health) world = Math.max(world, 1 + Math.max(e.src || 0, e.dst || 0, e.rank || 0));
      const measured = new Map();  // "src,dst" -> {link, step}: the last measurement up to the chosen round
      for (let k = 0; k <= pick; k++)
        for (const l of rounds[k].links || []) measured.set(`${l.src},${l.dst}`, {link: l, step: rounds[k].step});
      const events = new Map();  // "src,dst" -> the latest link event up to the chosen round's step
      const late = new Map();    // rank -> its latest straggler event
      for (const e of d.health) {
        if (e.step > atStep) continue;
        if (e.kind === "slow_link" || e.kind === "link_recovered") events.set(`${e.src},${e.dst}`, e);
        else late.set(e.rank, e);
      }
      let t = `<div class="run-block"><b>${esc(run.summary.name)}</b>`;
      if (world < 2) return t + '<div class="empty">one rank: no links to watch</div></div>';
      if (rounds.length > 1)
        t += ` <label>round <input type="range" class="round-pick" data-run="${i}" min="0" max="${rounds.length - 1}" value="${pick}"></label>`;
      if (pick >= 0) t += ` step ${rounds[pick].step}` + (rounds[pick].time ? ` (${esc(new Date(1e3 * rounds[pick].time).toLocaleTimeString())})` : "");
      t += `<table class="matrix" data-run="${esc(run.summary.name)}" data-step="${pick >= 0 ? rounds[pick].step : ""}"><tr><th>from \\ to</th>`;
      for (let c = 0; c < world; c++) t += `<th>${c}</th>`;
      t += "</tr>";
      for (let r = 0; r < world; r++) {
        t += `<tr><th>${r}</th>`;
        for (let c = 0; c < world; c++) {
          const key = `${r},${c}`, m = measured.get(key), e = events.get(key);
          if (r === c) { t += '<td class="self"></td>'; continue; }
          const cls = e ? (e.kind === "slow_link" ? "slow" : "recovered") : m || !rounds.length ? "ok" : "none";
          const ratio = m && m.link.baseline_gbps ? m.link.gbps / m.link.baseline_gbps : m ? null : e ? e.ratio : null;
          let title = e ? e.message : "";
          if (m) title += `${title ? "\n" : ""}${fmt(m.link.gbps, 3)} GB/s at step ${m.step}, baseline ` +
                          (m.link.baseline_gbps ? `${fmt(m.link.baseline_gbps, 3)} GB/s` : "not measured yet");
          const text = ratio !== null ? `${fmt(ratio, 2)}x` : m ? fmt(m.link.gbps, 3) : cls === "ok" ? "ok" : "–";
          const style = ratio !== null ? ` style="background:${ratioColor(ratio)}"` : "";
          t += `<td class="${cls}" data-link="${r}-${c}"${ratio !== null ? ` data-ratio="${fmt(ratio, 2)}"` : ""}${style} title="${esc(title)}">${text}</td>`;
        }
        t += "</tr>";
      }
      t += "</table>";
      const hostOf = d.mesh && d.mesh.ranks.every((x) => x.host) ? d.mesh.ranks.map((x) => x.host) : null;
      if (hostOf && new Set(hostOf).size > 1) t += hostTable(run.summary.name, hostLinks(hostOf, measured, events));
      if (late.size) {
        t += "<table><tr><th>rank</th><th>state</th><th>late ms</th><th>of collectives</th><th>since step</th></tr>";
        for (const [rank, e] of late)
          t += `<tr><td>${rank}</td><td class="text">${e.kind === "straggler" ? "late" : "recovered"}</td><td>${fmt(e.late_ms, 1)}</td>` +
               `<td>${fmt(100 * e.late_fraction, 0)}%</td><td>${e.since_step}</td></tr>`;
        t += "</table>";
      }
      if (d.health.length) {  // each warning at its step, and its time where the round logged one
        const timeAt = new Map(rounds.map((h) => [h.step, h.time]));
        const when = (e) => (timeAt.get(e.step) ? ` (${new Date(1e3 * timeAt.get(e.step)).toLocaleTimeString()})` : "");
        t += "<pre>" + d.health.map((e) => `step ${e.step}${when(e)}: ${esc(e.message)}`).join("\n") + "</pre>";
      }
      else t += '<div class="empty">no health warnings</div>';
      return t + "</div>";
    });
    $("health").innerHTML = html.join("");
  }
  // The links between hosts: ranks grouped by the host the run's mesh record names for each (hostOf[rank]);
  // the cell of hosts (a, b) gathers every link from a rank on a to a rank on b as of the chosen round
  // (measured: "src,dst" -> {link}; events: "src,dst" -> the latest slow_link/link_recovered), shown by its
  // worst link (the lowest bandwidth over baseline): one slow link between two hosts is what to look at.
  function hostLinks(hostOf, measured, events) {
    const hosts = Array.from(new Set(hostOf)).sort();
    const cells = new Map();  // "a|b" -> {links, ratio (worst), worst ("src-dst"), slow}
    const cell = (src, dst) => {
      const key = `${hostOf[src]}|${hostOf[dst]}`;
      if (!cells.has(key)) cells.set(key, {links: 0, ratio: null, worst: null, slow: false});
      return cells.get(key);
    };
    for (const [key, m] of measured) {
      const [src, dst] = key.split(",").map(Number);
      if (hostOf[src] === undefined || hostOf[dst] === undefined || hostOf[src] === hostOf[dst]) continue;
      const c = cell(src, dst);
      c.links += 1;
      const r = m.link.baseline_gbps ? m.link.gbps / m.link.baseline_gbps : null;
      if (r !== null && (c.ratio === null || r < c.ratio)) { c.ratio = r; c.worst = `${src}-${dst}`; }
    }
    for (const [key, e] of events) {
      const [src, dst] = key.split(",").map(Number);
      if (e.kind !== "slow_link" || hostOf[src] === undefined || hostOf[dst] === undefined || hostOf[src] === hostOf[dst]) continue;
      const c = cell(src, dst);
      c.slow = true;
      if (c.ratio === null) { c.ratio = e.ratio === undefined ? null : e.ratio; c.worst = `${src}-${dst}`; }
    }
    return {hosts: hosts, cells: cells};
  }

  function hostTable(name, hl) {
    let t = `<table class="matrix hosts" data-run="${esc(name)}"><tr><th>from host \\ to host</th>`;
    for (const h of hl.hosts) t += `<th>${esc(h)}</th>`;
    t += "</tr>";
    for (const a of hl.hosts) {
      t += `<tr><th>${esc(a)}</th>`;
      for (const b of hl.hosts) {
        const c = hl.cells.get(`${a}|${b}`);
        if (a === b) { t += '<td class="self"></td>'; continue; }
        if (!c) { t += `<td class="none" data-hosts="${esc(a)}|${esc(b)}">–</td>`; continue; }
        const ratio = c.ratio !== null && c.ratio !== undefined ? fmt(c.ratio, 2) : null;
        const style = ratio !== null ? ` style="background:${ratioColor(c.ratio)}"` : "";
        const title = `${c.links} link${c.links === 1 ? "" : "s"} measured` + (c.worst ? `; worst ${c.worst.replace("-", " -> ")}` : "");
        t += `<td class="${c.slow ? "slow" : "ok"}" data-hosts="${esc(a)}|${esc(b)}" data-links="${c.links}"` +
             `${ratio !== null ? ` data-ratio="${ratio}"` : ""}${style} title="${esc(title)}">${ratio !== null ? ratio + "x" : "ok"}</td>`;
      }
      t += "</tr>";
    }
    return t + "</table>";
  }
  $("health").addEventListener("change", (ev) => {
    const el = ev.target;
    if (!el.classList.contains("round-pick")) return;
    const i = Number(el.dataset.run);
    healthPick[i] = Number(el.value) === Number(el.max) ? undefined : Number(el.value);
    renderHealth(runs.map((r) => ({run: r, d: derive(r)})));
  });

  // Which rank holds which (tp, pp, dp) coordinate: the run's own mesh record (the trainer writes the
  // coordinates its DeviceMesh used), never recomputed here.
  function meshTable(mesh) {
    const hosts = mesh.ranks.some((r) => r.host);
    let t = `<table class="mesh" data-order="${esc(mesh.order)}"><tr><th>rank</th><th>tp</th><th>pp</th><th>dp</th>` +
            `${hosts ? "<th>host</th>" : ""}</tr>`;
    for (const r of mesh.ranks.slice(0, 512))
      t += `<tr data-rank="${r.rank}"><td>${r.rank}</td><td>${r.tp}</td><td>${r.pp}</td><td>${r.dp}</td>` +
           `${hosts ? `<td class="text">${esc(r.host || "")}</td>` : ""}</tr>`;
    return t + "</table>";
  }

  function renderConfig(all) {
    $("config").innerHTML = all.map(({run, d}) => {
      const s = run.summary;
      const p = d.prediction || {};
      let t = `<div class="run-block"><b>${esc(s.name)}</b> <span class="status-${esc(s.status)}">${esc(s.status)}</span>`;
      if (s.restarts) t += ` (restarted ${s.restarts}x)`;
      if (d.mesh) t += `<div>mesh tp ${d.mesh.tp} x pp ${d.mesh.pp} x dp ${d.mesh.dp} (order ${esc(d.mesh.order)}, innermost first)</div>` + meshTable(d.mesh);
      else if (p.layout) t += `<div>tp ${p.layout.tp} x pp ${p.layout.pp} x dp ${p.layout.dp} (the run recorded no rank coordinates)</div>`;
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

  // Applies one answer of the records endpoint or one records event to its run.
  function applyRecords(run, j) {
    if (j.reset) run.records = [];
    for (const r of j.records) run.records.push(r);
    run.generation = j.generation;
    run.next = j.next;
  }
  function applyHealth(run, j) {
    if (j.reset) run.health.records = [];
    for (const r of j.records) run.health.records.push(r);
    run.health.generation = j.generation;
    run.health.next = j.next;
  }
  function newRun(summary) {
    return {summary: summary, generation: 0, next: 0, records: [], health: {generation: 0, next: 0, records: []}};
  }
  function setSummaries(list) {
    for (const s of list) {
      if (!runs[s.id]) runs[s.id] = newRun(s);
      runs[s.id].summary = s;
    }
    uniqueNames();
  }

  // Server-sent events; polling when the stream cannot be opened (an old browser, a proxy that refuses it,
  // a dashboard at its stream limit). A dropped stream is the browser's to reopen, with the last event's id.
  let recordsEvents = 0;  // records events received (data-events: the browser test's proof of pushes)
  let freshStarts = 0;    // streams reopened without a Last-Event-ID after the server refused one
  function listen() {
    if (!window.EventSource) return poll();
    const es = new EventSource("/api/events");
    let opened = false;
    es.addEventListener("runs", (e) => {
      setSummaries(JSON.parse(e.data).runs);
      render();
    });
    es.addEventListener("records", (e) => {
      const j = JSON.parse(e.data);
      const run = runs[j.run];
      if (!run) return;  // the summaries always come first
      applyRecords(run, j);
      document.body.dataset.events = String(++recordsEvents);
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      render();
    });
    es.addEventListener("health", (e) => {
      const j = JSON.parse(e.data);
      const run = runs[j.run];
      if (!run) return;
      applyHealth(run, j);
      render();
    });
    es.onopen = () => { opened = true; $("mode").textContent = "live"; };
    es.onerror = () => {
      if (es.readyState === EventSource.CLOSED) {
        es.close();
        // A stream that worked and was then refused (a restarted dashboard serving other runs refuses the
        // old Last-Event-ID): a new stream starts every run over. One that never opened: poll instead.
        if (opened && freshStarts++ < 3) return void setTimeout(listen, 1000);
        $("mode").textContent = "live (polling)";
        poll();
      } else {
        $("updated").textContent = "dashboard server unreachable: reconnecting";
      }
    };
  }

  let pollUpdates = 0;  // polls that brought records (data-polled: the browser test's proof of polling)
  async function poll() {
    try {
      const answer = await (await fetch("/api/runs", {cache: "no-store"})).json();
      setSummaries(answer.runs);
      let fresh = 0;
      for (const s of answer.runs) {
        const run = runs[s.id];
        const q = `/api/runs/${s.id}/records?generation=${run.generation}&from=${run.next}`;
        const j = await (await fetch(q, {cache: "no-store"})).json();
        fresh += j.records.length;
        applyRecords(run, j);
        const hq = `/api/runs/${s.id}/health?generation=${run.health.generation}&from=${run.health.next}`;
        applyHealth(run, await (await fetch(hq, {cache: "no-store"})).json());
      }
      if (fresh) document.body.dataset.polled = String(++pollUpdates);
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
    for (const r of report.runs)
      runs.push({summary: r, generation: r.data.generation, next: r.data.next, records: r.data.records,
                 health: {generation: r.health.generation, next: r.health.next, records: r.health.records}});
    uniqueNames();
    render();
  } else {
    $("mode").textContent = "live";
    listen();
  }
})();
