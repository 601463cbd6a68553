"use strict";
// The analysts' page: Chart.js charts of a run's results (the rows the runner stored), drill-down
// by topic and consumer, a view range, and "run now" with Spark's progress over a WebSocket.
(function () {
  const $ = (id) => document.getElementById(id);
  const data = JSON.parse($("analytics-data").textContent || "{}");
  const css = getComputedStyle(document.documentElement);
  const color = (name) => css.getPropertyValue("--" + name).trim();
  const PALETTE = ["#4fa3ff", "#3ecf8e", "#ff6b6b", "#f5b841", "#b07cff", "#46d2d2", "#ff9f5a"];
  const fmt = new Intl.NumberFormat("en-US");
  if (window.Chart) {
    Chart.defaults.font.size = 11;
    Chart.defaults.color = color("muted");
    Chart.defaults.borderColor = color("line");
  }

  function table(job) {
    const t = data[job];
    if (!t || !t.rows) return [];
    return t.rows.map((r) => Object.fromEntries(t.columns.map((c, i) => [c, r[i]])));
  }
  const time = (iso) => (iso ? Date.parse(iso) : null);
  const day = (ms) => new Date(ms).toISOString().slice(0, 16).replace("T", " ");
  function bytes(v) {
    const u = ["B", "KiB", "MiB", "GiB"];
    let i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(v < 10 ? 1 : 0) : v) + " " + u[i];
  }
  const charts = {};
  function draw(id, config) {
    const canvas = $(id);
    if (!canvas) return;
    if (charts[id]) charts[id].destroy();
    config.options = Object.assign({ animation: false, responsive: true, maintainAspectRatio: false }, config.options || {});
    charts[id] = new Chart(canvas, config);
    // What the page drew, for people and tests alike: the number of data points shown.
    canvas.dataset.points = String(config.data.datasets.reduce(
      (n, d) => n + d.data.filter((p) => p !== null && (p.y === undefined || p.y !== null)).length, 0));
  }
  function options(select, values, chosen) {
    select.replaceChildren(...values.map((v) => {
      const o = document.createElement("option");
      o.value = v; o.textContent = v; o.selected = v === chosen;
      return o;
    }));
  }

  // ------------------------------------------------------------------ drill-down and range
  const traffic = table("traffic");
  const latency = table("latency");
  const health = table("consumer_health");
  const topics = [...new Set(traffic.filter((r) => r.scope === "subtree" && r.grain === "day").map((r) => r.topic))].sort();
  const consumers = [...new Set(latency.filter((r) => r.dimension === "consumer").map((r) => r.key))].sort();
  const worst = latency.filter((r) => r.dimension === "consumer" && !r.bucket).sort((a, b) => b.p99_ms - a.p99_ms)[0];
  options($("topic-pick"), topics, topics.includes("ALL") ? "ALL" : topics[0]);
  options($("consumer-pick"), consumers, worst ? worst.key : consumers[0]);
  const hours = traffic.filter((r) => r.grain === "hour").map((r) => time(r.bucket));
  if (hours.length) {
    $("view-since").value = day(Math.min(...hours)).replace(" ", "T");
    $("view-until").value = day(Math.max(...hours) + 3600e3).replace(" ", "T");
  }
  const viewRange = () => [
    $("view-since").value ? Date.parse($("view-since").value + "Z") : -Infinity,
    $("view-until").value ? Date.parse($("view-until").value + "Z") : Infinity,
  ];
  const timeAxis = () => {
    const [lo, hi] = viewRange();
    return {
      type: "linear", min: isFinite(lo) ? lo : undefined, max: isFinite(hi) ? hi : undefined,
      ticks: { maxTicksLimit: 8, callback: (v) => day(v).slice(5) },
    };
  };

  function drawTraffic() {
    const topic = $("topic-pick").value;
    $("traffic-scope").textContent = topic ? "· subtree " + topic : "";
    const rows = traffic.filter((r) => r.grain === "hour" && r.scope === "subtree" && r.topic === topic)
      .sort((a, b) => time(a.bucket) - time(b.bucket));
    const series = [["published", "accent"], ["delivered", "ok"], ["failed", "bad"], ["expired", "warn"]];
    draw("chart-traffic", {
      type: "line",
      data: { datasets: series.map(([k, c]) => ({
        label: k, borderColor: color(c), backgroundColor: color(c), pointRadius: 0, borderWidth: 1.6,
        data: rows.map((r) => ({ x: time(r.bucket), y: r[k] })),
      })) },
      options: { parsing: false, scales: { x: timeAxis(), y: { beginAtZero: true } } },
    });
  }

  function drawLatency() {
    const overall = latency.filter((r) => r.dimension === "consumer" && !r.bucket).sort((a, b) => a.key.localeCompare(b.key));
    draw("chart-latency", {
      type: "bar",
      data: {
        labels: overall.map((r) => r.key),
        datasets: [["p50_ms", "p50", "ok"], ["p95_ms", "p95", "warn"], ["p99_ms", "p99", "bad"]].map(([k, l, c]) => ({
          label: l, backgroundColor: color(c), data: overall.map((r) => r[k]),
        })),
      },
      options: { scales: { y: { type: "logarithmic", title: { display: true, text: "ms" } } } },
    });
    const key = $("consumer-pick").value;
    $("latency-key").textContent = key ? "· " + key : "";
    const rows = latency.filter((r) => r.dimension === "consumer" && r.key === key && r.bucket)
      .sort((a, b) => time(a.bucket) - time(b.bucket));
    draw("chart-latency-time", {
      type: "line",
      data: { datasets: [["p50_ms", "p50", "ok"], ["p95_ms", "p95", "warn"], ["p99_ms", "p99", "bad"], ["max_ms", "max", "muted"]].map(([k, l, c]) => ({
        label: l, borderColor: color(c), backgroundColor: color(c), pointRadius: 1.5, borderWidth: 1.4,
        data: rows.map((r) => ({ x: time(r.bucket), y: r[k] })),
      })) },
      options: { parsing: false, scales: { x: timeAxis(), y: { type: "logarithmic", title: { display: true, text: "ms" } } } },
    });
  }

  function drawHealth() {
    const rows = health.slice().sort((a, b) => (b.failure_rate || 0) - (a.failure_rate || 0));
    draw("chart-health", {
      type: "bar",
      data: {
        labels: rows.map((r) => r.consumer),
        datasets: [
          { label: "failure rate %", backgroundColor: color("bad"), yAxisID: "y", data: rows.map((r) => 100 * (r.failure_rate || 0)) },
          { label: "retries / delivered", backgroundColor: color("warn"), yAxisID: "y1", data: rows.map((r) => r.retries_per_delivered || 0) },
        ],
      },
      options: { scales: { y: { beginAtZero: true, position: "left" }, y1: { beginAtZero: true, position: "right", grid: { drawOnChartArea: false } } } },
    });
    const body = $("health-table").tBodies[0];
    body.replaceChildren(...rows.map((r) => {
      const tr = document.createElement("tr");
      const cells = [r.consumer, fmt.format(r.attempts), (100 * (r.failure_rate || 0)).toFixed(2) + " %", r.http_5xx, r.http_4xx,
        r.timeout, fmt.format(r.delivered), (r.retries_per_delivered || 0).toFixed(3), r.dead_letters, r.suspensions,
        r.mttr_s === null || r.mttr_s === undefined ? "–" : r.mttr_s.toFixed(1) + " s"];
      cells.forEach((v, i) => {
        const td = document.createElement("td");
        if (i) td.className = "n";
        td.textContent = v === null || v === undefined ? "–" : String(v);
        tr.appendChild(td);
      });
      return tr;
    }));
  }

  const top = table("top_n");
  const rankings = [...new Set(top.map((r) => r.ranking))];
  function drawTop() {
    const ranking = $("ranking-pick").value;
    const rows = top.filter((r) => r.ranking === ranking).sort((a, b) => a.rank - b.rank);
    draw("chart-top", {
      type: "bar",
      data: { labels: rows.map((r) => r.key), datasets: [{ label: ranking.replaceAll("_", " "), backgroundColor: PALETTE[0], data: rows.map((r) => r.value) }] },
      options: { indexAxis: "y", plugins: { legend: { display: false } } },
    });
  }

  function drawSizes() {
    const sizes = table("sizes");
    const hist = sizes.filter((r) => r.kind === "size").sort((a, b) => a.x - b.x);
    draw("chart-sizes", {
      type: "bar",
      data: { labels: hist.map((r) => "≥ " + bytes(r.x)), datasets: [{ label: "messages", backgroundColor: PALETTE[1], data: hist.map((r) => r.count) }] },
      options: { plugins: { legend: { display: false } }, scales: { y: { type: "logarithmic" } } },
    });
    const frags = sizes.filter((r) => r.kind === "fragments").sort((a, b) => a.x - b.x);
    draw("chart-fragments", {
      type: "bar",
      data: { labels: frags.map((r) => String(r.x)), datasets: [{ label: "messages", backgroundColor: PALETTE[4], data: frags.map((r) => r.count) }] },
      options: { plugins: { legend: { display: false } }, scales: { x: { title: { display: true, text: "fragments" } } } },
    });
    const heat = sizes.filter((r) => r.kind === "heatmap");
    const max = Math.max(1, ...heat.map((r) => r.count));
    const days = ["", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    draw("chart-heatmap", {
      type: "bubble",
      data: { datasets: [{
        label: "published", pointStyle: "rect",
        data: heat.map((r) => ({ x: r.y, y: r.x, r: 8, count: r.count })),
        backgroundColor: heat.map((r) => `rgba(79, 163, 255, ${0.08 + 0.92 * r.count / max})`),
        borderWidth: 0,
      }] },
      options: {
        plugins: { legend: { display: false }, tooltip: { callbacks: { label: (c) => `${days[c.raw.y]} ${c.raw.x}:00 — ${fmt.format(c.raw.count)}` } } },
        scales: { x: { min: -0.5, max: 23.5, ticks: { stepSize: 3 }, title: { display: true, text: "hour (UTC)" } },
          y: { min: 0, max: 8, reverse: true, ticks: { stepSize: 1, autoSkip: false, callback: (v) => days[v] || "" } } },
      },
    });
  }

  function drawRegressions() {
    const rows = table("regressions").slice(0, 12);
    $("regressions-empty").hidden = rows.length > 0;
    draw("chart-regressions", {
      type: "bar",
      data: {
        labels: rows.map((r) => r.consumer),
        datasets: [
          { label: "p99 rise (ms)", backgroundColor: color("bad"), yAxisID: "y", data: rows.map((r) => r.p99_rise_ms) },
          { label: "failure rate rise (points)", backgroundColor: color("warn"), yAxisID: "y1", data: rows.map((r) => 100 * (r.failure_rate_rise || 0)) },
        ],
      },
      options: { scales: { y: { position: "left" }, y1: { position: "right", grid: { drawOnChartArea: false } } } },
    });
  }

  // The charts exist only once a run has results; "run now" works either way.
  if ($("chart-traffic")) {
    options($("ranking-pick"), rankings, rankings.includes("topics_by_volume") ? "topics_by_volume" : rankings[0]);
    drawTraffic(); drawLatency(); drawHealth(); drawTop(); drawSizes(); drawRegressions();
    $("topic-pick").addEventListener("change", drawTraffic);
    $("consumer-pick").addEventListener("change", drawLatency);
    $("ranking-pick").addEventListener("change", drawTop);
    for (const id of ["view-since", "view-until"]) $(id).addEventListener("change", () => { drawTraffic(); drawLatency(); });
  }

  // ------------------------------------------------------------------ run now
  const form = $("run-form");
  function follow(runId, retry) {
    $("run-progress-box").hidden = false;
    const bar = $("run-progress"), text = $("run-progress-text");
    bar.dataset.state = "running";
    retry = retry || 1000;
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(scheme + location.host + "/ws/analytics/runs/" + runId + "/");
    ws.onopen = () => { retry = 1000; };
    ws.onmessage = (ev) => {
      const p = JSON.parse(ev.data).progress || {};
      bar.value = p.fraction || 0;
      if (p.state === "succeeded" || p.state === "failed") {
        bar.dataset.state = p.state;
        bar.value = p.state === "succeeded" ? 1 : bar.value;
        text.replaceChildren(document.createTextNode(p.state === "succeeded"
          ? `done: ${fmt.format(p.input_rows || 0)} events in ${(p.duration_s || 0).toFixed(1)} s · ` : "failed · "));
        const a = document.createElement("a");
        a.href = "?run=" + runId; a.id = "run-result-link"; a.textContent = "show this run";
        text.appendChild(a);
        if (p.state === "failed") { $("run-error").hidden = false; $("run-error").textContent = p.error || "the run failed"; }
        ws.close();
        return;
      }
      bar.dataset.jobsDone = p.jobs_done;
      text.textContent = `${p.job || "starting"} · job ${Math.min(p.jobs_done + 1, p.jobs_total)}/${p.jobs_total}` +
        (p.tasks_total ? ` · tasks ${p.tasks_done}/${p.tasks_total} (stages done ${p.stages_done})` : "");
    };
    ws.onclose = (ev) => {
      if (ev.code === 4401 || ev.code === 4403) { text.textContent = "not allowed to follow this run"; bar.dataset.state = "closed"; return; }
      // A dropped socket (a restart, a proxy's timeout) reconnects; the server sends the run's
      // latest progress on connect, so nothing is missed.
      if (bar.dataset.state === "running") setTimeout(() => follow(runId, Math.min(retry * 2, 15000)), retry);
    };
  }
  if (form) {
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      $("run-error").hidden = true;
      const body = new FormData(form);
      for (const k of ["since", "until"]) body.set(k, body.get(k) + ":00+00:00");
      const res = await fetch(form.action, { method: "POST", body, credentials: "same-origin" });
      const out = await res.json().catch(() => ({}));
      if (res.status !== 202) {
        $("run-error").hidden = false;
        $("run-error").textContent = out.detail || ("refused: HTTP " + res.status);
        return;
      }
      follow(out.id);
    });
  }
})();
