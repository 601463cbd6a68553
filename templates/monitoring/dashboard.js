"use strict";
// The live dashboard: one WebSocket, a snapshot a second, charts drawn with Chart.js (vendored,
// served by this site: no build step, no CDN), redrawn each second.
(function () {
  const WINDOW_S = 900;
  const MAX_POINTS = 900;
  const points = [];        // one per second, oldest first: {t, in, out, fail, ...}
  let clockOffset = 0;      // server time - browser time, seconds
  let lastStats = null;
  let lastMessageAt = 0;
  let retryDelay = 1000;

  const $ = (id) => document.getElementById(id);
  const fmt = new Intl.NumberFormat("en-US");
  const num = (v) => (v === null || v === undefined ? "–" : fmt.format(v));
  const ms = (v) => (v === null || v === undefined ? "–" : v < 10 ? v.toFixed(2) + " ms" : v < 1000 ? v.toFixed(1) + " ms" : (v / 1000).toFixed(2) + " s");
  function bytes(v) {
    if (!v) return "–";
    const u = ["B", "KiB", "MiB", "GiB"];
    let i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return v.toFixed(i ? 1 : 0) + " " + u[i];
  }
  function duration(s) {
    if (s === null || s === undefined) return "–";
    s = Math.floor(s);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }
  function setNum(id, v) {
    const el = $(id);
    if (!el) return;
    el.dataset.value = v === null || v === undefined ? "" : String(v);
    el.textContent = num(v);
  }

  // ------------------------------------------------------------------ connection
  function setStatus(state, text) {
    const el = $("conn-status");
    el.className = "badge " + state;
    el.dataset.state = state;
    el.textContent = text;
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(scheme + location.host + "/ws/monitoring/");
    setStatus("connecting", "connecting…");
    ws.onopen = () => { retryDelay = 1000; setStatus("live", "live"); };
    ws.onmessage = (ev) => {
      const msg = JSON.parse(ev.data);
      lastMessageAt = Date.now();
      if (msg.type === "history") {
        points.length = 0;
        for (const p of msg.points || []) addPoint(p);
        if (msg.stats) render(msg.stats);
      } else if (msg.type === "stats") {
        addPoint(msg.stats.point);
        render(msg.stats);
      }
    };
    ws.onclose = (ev) => {
      if (ev.code === 4401 || ev.code === 4403) {
        setStatus("closed", ev.code === 4401 ? "not logged in" : "forbidden");
        const b = $("auth-banner");
        b.hidden = false;
        b.textContent = ev.code === 4401
          ? "Your session has ended: log in again to see live figures."
          : "This account may not see the monitoring dashboard.";
        return;
      }
      setStatus("closed", "disconnected, retrying");
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 15000);
    };
  }

  function addPoint(p) {
    if (!p) return;
    const last = points[points.length - 1];
    if (last && p.t <= last.t) {
      if (p.t === last.t) points[points.length - 1] = p;
      return;
    }
    points.push(p);
    while (points.length > MAX_POINTS) points.shift();
  }

  // ------------------------------------------------------------------ figures and tables
  function render(s) {
    lastStats = s;
    clockOffset = s.generated_at - Date.now() / 1000;
    $("updated").textContent = "updated " + new Date(s.generated_at * 1000).toLocaleTimeString();
    for (const name of ["accepted", "delivered", "failed", "retried", "dead", "expired"]) {
      setNum(name + "-ps", s.per_second[name]);
      setNum(name + "-pm", s.per_minute[name]);
      setNum(name + "-total", s.totals[name]);
    }
    const q = s.queues;
    setNum("retries-waiting", q.retries_waiting);
    setNum("dead-waiting", q.dead_letters);
    $("lat-p50").textContent = ms(s.latency_ms.p50);
    $("lat-p95").textContent = ms(s.latency_ms.p95);
    $("lat-p99").textContent = ms(s.latency_ms.p99);
    setNum("lat-count", s.latency_ms.count);
    $("q-celery").textContent = num(q.celery);
    $("q-ingest").textContent = num(q.ingest);
    $("q-subs").textContent = num(q.subscriptions);
    $("q-sub-msgs").textContent = num(q.subscription_messages);
    $("q-pp-count").textContent = num(q.pullpoint_count);
    $("q-pp-msgs").textContent = num(q.pullpoint_messages);
    fill("deepest", q.deepest, (r) => [r.subscription, r.consumer, [num(r.depth), "n"]], "all subscription queues are empty");
    fill("pullpoints", q.pullpoints, (r) => [r.pullpoint, [num(r.depth), "n"]], "no messages waiting in pull points");
    fill("topics", s.topics, (r) => [r.topic, [num(r.per_minute || 0), "n"], [num(r.total || 0), "n"]], "no notifications yet");
    fill("consumers", s.consumers, (r) => [
      r.consumer, [num(r.failed_per_minute || 0), "n"], [num(r.failed || 0), "n"], [num(r.retried || 0), "n"],
      [num(r.dead || 0), "n"], [num(r.delivered_per_minute || 0), "n"], [num(r.delivered || 0), "n"],
    ], "no deliveries yet");
    const nodes = s.nodes || [];
    fill("nodes", nodes, (n) => [
      [n.state, "badge " + n.state], n.role, n.name, n.host, [String(n.pid), "n"], n.version,
      [n.pool === null || n.pool === undefined ? "–" : String(n.pool), "n"], [duration(n.uptime_s), "n"],
      [duration(n.age_s) + " ago", "n"], [n.state === "alive" || n.state === "late" ? (n.cpu ?? 0).toFixed(1) : "–", "n"],
      [bytes(n.rss), "n"], [num(n.threads), "n"], [num(n.fds), "n"],
    ], "no node has registered", (n) => n.state);
    const by = s.nodes_by_state || {};
    $("nodes-summary").textContent = Object.keys(by).sort().map((k) => by[k] + " " + k).join(" · ");
  }

  // Rebuild a table body from rows of cells: a cell is text or [text, className].
  function fill(id, rows, cells, emptyText, rowClass) {
    const body = $(id).tBodies[0];
    const frag = document.createDocumentFragment();
    if (!rows || !rows.length) {
      const tr = document.createElement("tr");
      const td = document.createElement("td");
      td.colSpan = $(id).tHead.rows[0].cells.length;
      td.className = "empty";
      td.textContent = emptyText;
      tr.appendChild(td);
      frag.appendChild(tr);
    }
    for (const row of rows || []) {
      const tr = document.createElement("tr");
      if (rowClass) tr.className = rowClass(row);
      for (const cell of cells(row)) {
        const td = document.createElement("td");
        if (Array.isArray(cell)) {
          if (cell[1].startsWith("badge")) {
            const span = document.createElement("span");
            span.className = cell[1];
            span.textContent = cell[0];
            td.appendChild(span);
          } else {
            td.className = cell[1];
            td.textContent = cell[0];
          }
        } else {
          td.textContent = cell === null || cell === undefined ? "–" : String(cell);
        }
        tr.appendChild(td);
      }
      frag.appendChild(tr);
    }
    body.replaceChildren(frag);
  }

  // ------------------------------------------------------------------ charts (Chart.js)
  // The x axis is seconds before the server's "now"; the charts are redrawn once a second, when
  // a snapshot arrives (Chart.js, vendored: monitoring/vendor/chartjs).
  const css = getComputedStyle(document.documentElement);
  const color = (name) => css.getPropertyValue("--" + name).trim();
  const CHARTS = [
    { id: "rate", series: [["in", "in", "notifications in"], ["out", "out", "deliveries out"]] },
    { id: "fail", series: [["fail", "fail", "failed"], ["retry", "retry", "retries"], ["dead", "dead", "dead"], ["exp", "exp", "expired"]] },
    { id: "lat", series: [["p50", "p50", "p50"], ["p95", "p95", "p95"], ["p99", "p99", "p99"]] },
    { id: "queue", series: [["q", "in", "subscription queues"], ["cq", "retry", "celery"], ["rw", "fail", "retries waiting"]] },
  ];
  Chart.defaults.font.size = 11;
  Chart.defaults.color = color("muted");
  Chart.defaults.borderColor = color("line");
  for (const c of CHARTS) {
    c.chart = new Chart($("chart-" + c.id), {
      type: "line",
      data: {
        datasets: c.series.map(([, col, label]) => ({
          label, data: [], borderColor: color(col), backgroundColor: color(col),
          borderWidth: 1.6, pointRadius: 0, tension: 0, spanGaps: 3,
        })),
      },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
        normalized: true, interaction: { mode: "nearest", axis: "x", intersect: false },
        plugins: { legend: { position: "top", align: "end", labels: { boxWidth: 10, boxHeight: 3 } } },
        scales: {
          x: {
            type: "linear", min: -WINDOW_S, max: 0,
            ticks: { stepSize: 180, callback: (v) => (v === 0 ? "now" : Math.round(v / 60) + " min") },
          },
          y: { beginAtZero: true, ticks: { maxTicksLimit: 5 } },
        },
      },
    });
  }

  function redraw() {
    const now = Date.now() / 1000 + clockOffset - 1.5; // the newest second is ~1.5 s old
    for (const c of CHARTS) {
      c.series.forEach(([key], i) => {
        const data = [];
        let prevT = null;
        for (const p of points) {
          if (p.t < now - WINDOW_S - 2) continue;
          const v = p[key];
          // A gap (no snapshot for more than 3 s, or no value) breaks the line.
          if (prevT !== null && p.t - prevT > 3) data.push({ x: p.t - now, y: null });
          data.push({ x: p.t + 1 - now, y: v === undefined ? null : v });  // known at its end
          prevT = p.t;
        }
        c.chart.data.datasets[i].data = data;
      });
      c.chart.update("none");
    }
  }

  function watch() {
    if (lastMessageAt && Date.now() - lastMessageAt > 5000 && $("conn-status").dataset.state === "live") {
      setStatus("late", "no data for " + Math.round((Date.now() - lastMessageAt) / 1000) + " s");
    } else if (lastMessageAt && Date.now() - lastMessageAt <= 5000 && $("conn-status").dataset.state === "late") {
      setStatus("live", "live");
    }
    redraw();
  }

  connect();
  setInterval(watch, 1000);
})();
