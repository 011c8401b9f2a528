// The dashboard page: one EventSource per viewed run; every update replaces what it describes.
"use strict";

const settings = JSON.parse(document.getElementById("settings").textContent);
const $ = (id) => document.getElementById(id);
let runId = settings.run;
let source = null;
let lastDoc = null;  // the latest document: the loss view's choice redraws from it
const LOG_LIMIT = 2000;

// The token travels in the HttpOnly cookie the first visit got: no URL carries it.
function runPath(id) {
  return encodeURIComponent(id);
}

function webLink(url) {
  return typeof url === "string" && /^https?:\/\/[^\s]+$/i.test(url);
}

function text(value, fallback = "-") {
  return value === null || value === undefined ? fallback : String(value);
}

function num(value, digits = 4) {
  return typeof value === "number" ? Number(value.toPrecision(digits)).toString() : "-";
}

function duration(seconds) {
  if (typeof seconds !== "number") return "-";
  const s = Math.round(seconds), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  if (h) return `${h}h${String(m).padStart(2, "0")}m`;
  return m ? `${m}m${String(s % 60).padStart(2, "0")}s` : `${s % 60}s`;
}

function mib(bytes) {
  return typeof bytes === "number" ? `${Math.round(bytes / 1048576)} MiB` : "-";
}

function clock(epoch) {
  return typeof epoch === "number" ? new Date(epoch * 1000).toLocaleString() : "-";
}

function el(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function pill(state) {
  return el("span", { class: `pill s-${state}`, text: state || "-" });
}

function progressBar(worker) {
  const fraction = typeof worker.progress === "number" ? worker.progress : 0;
  const label = worker.step === null || worker.step === undefined ? "-"
    : worker.target_steps ? `${worker.step} / ${worker.target_steps}` : String(worker.step);
  const eta = typeof worker.eta_seconds === "number" ? ` · ETA ${duration(worker.eta_seconds)}` : "";
  const bar = el("div", { class: fraction >= 1 ? "bar done" : "bar" },
    [el("i"), el("span", { text: label + eta })]);
  bar.firstChild.style.width = `${(fraction * 100).toFixed(1)}%`;
  return bar;
}

function renderWorkers(doc) {
  const body = $("workers").tBodies[0];
  body.replaceChildren(...doc.workers.map((w) => el("tr", { "data-worker": w.name }, [
    el("td", { text: w.role && w.role !== "worker" ? `${w.name} (${w.role})` : w.name }),
    el("td", { text: w.host }),
    el("td", { title: text(w.reason, "") }, [pill(w.state)]),
    el("td", {}, [progressBar(w)]),
    el("td", { text: num(w.loss) }), el("td", { text: num(w.accuracy, 3) }),
    el("td", { text: num(w.val_loss) }), el("td", { text: num(w.val_accuracy, 3) }),
    el("td", { text: num(w.steps_per_sec, 3) }), el("td", { text: text(w.checkpoint_step) }),
    el("td", { text: typeof w.cpu_percent === "number" ? `${num(w.cpu_percent, 3)}%` : "-" }),
    el("td", { text: mib(w.rss_bytes) }),
    el("td", { text: (w.devices || []).map((d) => d.replace("/device:", "")).join(", ") || "-" }),
  ])));
}

function renderSummary(doc) {
  const status = doc.status || {};
  const steps = doc.workers.map((w) => w.step).filter((s) => typeof s === "number");
  const rates = doc.workers.map((w) => w.steps_per_sec).filter((s) => typeof s === "number");
  const etas = doc.workers.map((w) => w.eta_seconds).filter((s) => typeof s === "number");
  const target = doc.workers.map((w) => w.target_steps).find((s) => typeof s === "number");
  const stats = [
    ["step", steps.length ? `${Math.min(...steps)}${target ? ` / ${target}` : ""}` : "-"],
    ["steps/s", rates.length ? num(Math.min(...rates), 3) : "-"],
    ["ETA", etas.length ? duration(Math.max(...etas)) : "-"],
    ["attempt", text(status.attempt)],
    ["restarts", text(status.restarts)],
    ["running for", duration(Date.now() / 1000 - doc.created_at)],
  ];
  $("summary").replaceChildren(...stats.map(([k, v]) =>
    el("div", { class: "stat" }, [el("div", { class: "k", text: k }), el("div", { class: "v", text: v })])),
    ...(status.pace ? [el("div", { class: "muted-line pace", text: `pace: ${status.pace}` })] : []));
}

// The stacks kept at the stall that ended this restart's attempt: one link per worker.
function stackLinks(run, restart) {
  const names = Array.isArray(restart.stacks) ? restart.stacks : [];
  if (!names.length) return [];
  const part = (value) => encodeURIComponent(String(value));
  const links = names.map((name) => el("a", {
    class: "stacks", target: "_blank", rel: "noopener",
    href: `/api/runs/${part(run)}/stacks/${part(restart.attempt)}/${part(name)}`, text: name,
  }));
  return [el("span", { class: "stacks", text: " · stacks: " }),
    ...links.flatMap((link, i) => (i ? [document.createTextNode(" "), link] : [link]))];
}

function renderTimeline(doc) {
  const cause = $("root-cause");
  cause.textContent = doc.root_cause ? `root cause: ${doc.root_cause}` : "";
  cause.classList.toggle("hidden", !doc.root_cause);
  const items = doc.timeline.map((r) => el("li", { class: "restart" }, [
    el("span", { class: "when", text: new Date(r.at * 1000).toLocaleTimeString() }),
    el("span", { text: r.alone ? r.text : `restart ${r.number} (attempt ${r.attempt} failed): ${r.text}` }),
    ...stackLinks(doc.run_id, r),
  ]));
  $("timeline").replaceChildren(...(items.length ? items
    : [el("li", { class: "empty", text: "no restarts" })]));
}

// The loss chart's view: raw, smoothed or log10 (each rendered by the server, dashboard/curves.py).
function lossView() {
  const chosen = $("loss-view") ? $("loss-view").value : "loss";
  return ["loss", "loss_smoothed", "loss_log"].includes(chosen) ? chosen : "loss";
}

function renderPreflight(doc) {
  const report = doc.preflight;
  if (!report || !report.findings) {
    $("preflight").replaceChildren(el("div", { class: "muted-line", text: "no preflight check of this run's inventory recorded before it began" }));
    return;
  }
  const problems = report.findings.filter((f) => f.status !== "ok");
  const head = el("div", { class: "muted", text:
    `${clock(report.checked_at)}: ${report.findings.length} findings, ${problems.length} warning(s) or failure(s)` });
  const rows = (problems.length ? problems : report.findings.slice(0, 8)).map((f) => el("tr", {}, [
    el("td", { text: f.host }), el("td", { text: f.check }),
    el("td", { class: `f-${f.status}`, text: f.status }), el("td", { text: f.detail }),
  ]));
  // check --perf's figures: every compute and throughput finding, whatever its status
  const perf = report.findings.filter((f) => f.figures && !problems.includes(f));
  const perfRows = perf.map((f) => el("tr", {}, [
    el("td", { text: f.host }), el("td", { text: f.check }),
    el("td", { class: `f-${f.status}`, text: f.status }), el("td", { text: f.detail }),
  ]));
  $("preflight").replaceChildren(head, el("table", {}, [el("tbody", {}, rows)]),
    ...(perfRows.length ? [el("div", { class: "muted", text: "performance (check --perf)" }),
      el("table", { class: "perf" }, [el("tbody", {}, perfRows)])] : []));
}

function renderRuns(doc) {
  $("runs").tBodies[0].replaceChildren(...doc.runs.map((r) => el("tr", { class: r.run_id === doc.run_id ? "current" : "" }, [
    el("td", {}, [el("a", { href: `/runs/${runPath(r.run_id)}`, text: r.run_id })]),
    el("td", { text: text(r.job) }), el("td", { text: clock(r.created_at) }),
    el("td", { text: text(r.workers) }), el("td", { text: text(r.restarts) }),
    el("td", { class: "goodput", text: typeof r.goodput === "number" ? `${Math.round(r.goodput * 100)} %` : "-" }),
    el("td", {}, [r.state ? pill(r.state) : el("span", { class: "muted", text: "not recorded" })]),
    el("td", { text: r.unreadable ? `unreadable: ${r.unreadable}` : text(r.outcome, "") }),
  ])));
}

// Every job holding leases on the run's hosts, any user's: their records are other users'
// input, shown through textContent only.
function renderLeases(doc) {
  const leases = doc.leases;
  $("leases-card").classList.toggle("hidden", !leases);
  if (!leases) return;
  const jobs = Array.isArray(leases.jobs) ? leases.jobs : [];
  const rows = jobs.map((j) => {
    const hosts = Object.entries(j.hosts || {});
    const ports = hosts.map(([h, l]) => `${h}: ${(l.ports || []).join(",") || "-"}`).join("; ");
    const gpus = hosts.filter(([, l]) => (l.gpus || []).length)
      .map(([h, l]) => `${h}: ${l.gpus.join(",")}`).join("; ");
    return el("tr", { class: j.run_id === doc.run_id ? "current" : "" }, [
      el("td", { text: text(j.user) }), el("td", { text: text(j.job) }),
      el("td", { text: text(j.run_id) }), el("td", { text: hosts.map(([h]) => h).join(", ") }),
      el("td", { text: ports || "-" }), el("td", { text: gpus || "-" }),
      el("td", { text: clock(j.since) }),
    ]);
  });
  // The queued jobs ('up --queue'), in the order they will start.
  const queued = Array.isArray(leases.queued) ? leases.queued : [];
  queued.forEach((j, place) => {
    const hosts = Object.entries(j.hosts || {});
    const ports = hosts.filter(([, t]) => (t.ports || []).length)
      .map(([h, t]) => `${h}: ${t.ports.join(",")}`).join("; ");
    const gpus = hosts.filter(([, t]) => t.count)
      .map(([h, t]) => `${h}: ${t.count} of ${(t.gpus || []).join(",")}`).join("; ");
    rows.push(el("tr", { class: "queued" }, [
      el("td", { text: text(j.user) }), el("td", { text: text(j.job) }),
      el("td", { text: text(j.run_id) }), el("td", { text: hosts.map(([h]) => h).join(", ") }),
      el("td", { text: ports || "-" }), el("td", { text: gpus || "-" }),
      el("td", { text: `queued #${place + 1} since ${clock(j.since)}` }),
    ]));
  });
  $("leases").tBodies[0].replaceChildren(...rows);
  const ignored = Array.isArray(leases.ignored) ? leases.ignored : [];
  $("leases-ignored").textContent = ignored.map((i) =>
    `ignored ${i.host}: ${i.file}: ${i.reason}`).join("\n");
}

function render(doc) {
  lastDoc = doc;
  if (doc.error) {
    $("run-title").textContent = doc.error;
    return;
  }
  if (settings.follow && doc.latest_run_id && doc.latest_run_id !== runId) {
    connect(doc.latest_run_id);  // a newer run started: follow it
    return;
  }
  const status = doc.status || {};
  $("run-title").textContent = `${doc.job} · run ${doc.run_id}`;
  $("run-state").replaceWith(Object.assign(pill(status.state), { id: "run-state" }));
  document.title = `${status.state} · ${doc.job} · orchestrate`;
  const tb = $("tensorboard");
  const board = doc.tensorboard && webLink(doc.tensorboard.url) ? doc.tensorboard.url : null;
  tb.classList.toggle("hidden", !board);
  if (board) tb.href = board; else tb.removeAttribute("href");
  const mlflow = $("mlflow");  // the run's one MLflow run (job.tracking)
  const tracked = webLink(doc.mlflow) ? doc.mlflow : null;
  mlflow.classList.toggle("hidden", !tracked);
  if (tracked) mlflow.href = tracked; else mlflow.removeAttribute("href");
  renderSummary(doc);
  renderWorkers(doc);
  // Server-rendered like the charts (dashboard/charts.py): escaped there, no host text raw.
  $("goodput-bar").innerHTML = doc.goodput ? doc.goodput.bar : "";
  $("goodput-line").textContent = doc.goodput ? doc.goodput.line : "";
  $("chart-loss").innerHTML = doc.charts[lossView()] || doc.charts.loss;
  $("chart-rate").innerHTML = doc.charts.steps_per_sec;
  $("chart-val-loss").innerHTML = doc.charts.val_loss;
  $("chart-val-accuracy").innerHTML = doc.charts.val_accuracy;
  renderTimeline(doc);
  renderPreflight(doc);
  renderLeases(doc);
  renderRuns(doc);
}

function appendLogs(entries) {
  const box = $("logs");
  const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 30;
  for (const entry of entries) {
    const line = el("div", { class: "line", "data-worker": entry.worker });
    if (entry.prefix) line.append(el("span", { class: `c-${entry.colour}`, text: entry.prefix }), " ");
    line.append(el("span", { class: entry.worker ? "" : "sys", text: entry.line }));
    box.append(line);
  }
  while (box.childNodes.length > LOG_LIMIT) box.firstChild.remove();
  $("log-count").textContent = `${box.childNodes.length} lines`;
  if (atBottom) box.scrollTop = box.scrollHeight;
}

function connect(id) {
  if (source) source.close();
  runId = id;
  $("logs").replaceChildren();
  source = new EventSource(`/api/runs/${runPath(id)}/events`);
  source.addEventListener("dashboard", (event) => render(JSON.parse(event.data)));
  source.addEventListener("log", (event) => appendLogs(JSON.parse(event.data)));
  source.onopen = () => $("live").classList.add("on");
  source.onerror = () => $("live").classList.remove("on");  // EventSource reconnects by itself
}

function waitForRun() {
  $("run-title").textContent = "no run yet: start one with 'orchestrate up INVENTORY'";
  fetch("/api/runs").then((answer) => answer.json()).then((data) => {
    const current = data.runs.find((r) => r.current) || data.runs[0];
    if (current) connect(current.run_id);
    else setTimeout(waitForRun, 2000);
  }).catch(() => setTimeout(waitForRun, 2000));
}

$("loss-view").addEventListener("change", () => {
  if (lastDoc) $("chart-loss").innerHTML = lastDoc.charts[lossView()] || lastDoc.charts.loss;
});
if (runId) connect(runId); else waitForRun();
