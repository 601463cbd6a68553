"use strict";
// The live dashboard: one WebSocket, a snapshot a second, charts drawn on <canvas> by hand
// (no build step, no CDN). The time axis scrolls with the clock between snapshots, so the
// charts move smoothly instead of jumping once a second.
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

  // ------------------------------------------------------------------ charts
  const css = getComputedStyle(document.documentElement);
  const color = (name) => css.getPropertyValue("--" + name).trim();
  const CHARTS = [
    { id: "rate", series: [["in", "in", "notifications in"], ["out", "out", "deliveries out"]] },
    { id: "fail", series: [["fail", "fail", "failed"], ["retry", "retry", "retries"], ["dead", "dead", "dead"], ["exp", "exp", "expired"]] },
    { id: "lat", series: [["p50", "p50", "p50"], ["p95", "p95", "p95"], ["p99", "p99", "p99"]] },
    { id: "queue", series: [["q", "in", "subscription queues"], ["cq", "retry", "celery"], ["rw", "fail", "retries waiting"]] },
  ];
  for (const c of CHARTS) {
    const legend = document.querySelector(`.legend[data-chart="${c.id}"]`);
    for (const [, col, label] of c.series) {
      const i = document.createElement("i");
      i.style.background = color(col);
      legend.appendChild(i);
      legend.appendChild(document.createTextNode(label));
    }
  }

  function niceMax(v) {
    if (v <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  function draw(chart, now) {
    const canvas = $("chart-" + chart.id);
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth, h = canvas.clientHeight;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const left = 48, right = 8, top = 6, bottom = 18;
    const pw = w - left - right, ph = h - top - bottom;
    const t1 = now, t0 = now - WINDOW_S;
    let max = 0;
    for (const p of points) {
      if (p.t < t0 - 1) continue;
      for (const [key] of chart.series) if (p[key] > max) max = p[key];
    }
    max = niceMax(max);
    const x = (t) => left + ((t - t0) / WINDOW_S) * pw;
    const y = (v) => top + ph - (v / max) * ph;
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = color("muted");
    ctx.strokeStyle = color("line");
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const v = (max * i) / 4;
      const yy = Math.round(y(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(left + pw, yy); ctx.stroke();
      ctx.fillText(v >= 1000 ? fmt.format(Math.round(v)) : +v.toFixed(2), left - 6, yy);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (let m = 0; m <= 15; m += 3) {
      const xx = x(t1 - m * 60);
      ctx.fillText(m === 0 ? "now" : "-" + m + " min", Math.min(Math.max(xx, left + 14), left + pw - 14), top + ph + 4);
    }
    ctx.save();
    ctx.beginPath(); ctx.rect(left, top, pw, ph); ctx.clip();
    ctx.lineWidth = 1.6;
    ctx.lineJoin = "round";
    for (const [key, col] of chart.series) {
      ctx.strokeStyle = color(col);
      ctx.beginPath();
      let pen = false, prevT = null;
      for (const p of points) {
        if (p.t < t0 - 2) continue;
        const v = p[key];
        // A gap (no snapshot for more than 3 s, or no value) breaks the line.
        if (v === null || v === undefined || (prevT !== null && p.t - prevT > 3)) pen = false;
        if (v !== null && v !== undefined) {
          const px = x(p.t + 1), py = y(v);  // a second's count is known at its end
          if (pen) ctx.lineTo(px, py); else ctx.moveTo(px, py);
          pen = true;
        }
        prevT = p.t;
      }
      ctx.stroke();
    }
    ctx.restore();
  }

  let lastFrame = 0;
  function frame(ts) {
    // ~30 frames a second is smooth enough and leaves the CPU to the rest of the page.
    if (ts - lastFrame >= 33) {
      lastFrame = ts;
      const now = Date.now() / 1000 + clockOffset - 1.5; // the newest second is ~1.5 s old
      for (const c of CHARTS) draw(c, now);
      if (lastMessageAt && Date.now() - lastMessageAt > 5000 && $("conn-status").dataset.state === "live") {
        setStatus("late", "no data for " + Math.round((Date.now() - lastMessageAt) / 1000) + " s");
      } else if (lastMessageAt && Date.now() - lastMessageAt <= 5000 && $("conn-status").dataset.state === "late") {
        setStatus("live", "live");
      }
    }
    requestAnimationFrame(frame);
  }

  connect();
  requestAnimationFrame(frame);
})();
