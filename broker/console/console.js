// Magnetar's operator console: a client of the broker's admin REST (/admin/v2/...), the
// same API the CLI uses, with no endpoint of its own. Each page answers one question:
//   #/                 which topics and subscriptions are falling behind (backlog, rates)
//   #/topic/<path>     one topic: rates and backlog over time (the broker's own history,
//                      .../statsHistory: there on page load), since when each subscription
//                      falls behind, who holds their unacknowledged messages; peek, skip,
//                      reset a cursor
//   #/cluster          brokers and bundle ownership, bookies' disks and read-only state,
//                      under-replicated ledgers
// The token (when the cluster asks for one) stays in this tab's sessionStorage and goes
// in the Authorization header of each request: what the role may not see, the broker
// refuses (403) and the page says so. Numbers carry their unit; pages say how old they are.
"use strict";

const REFRESH_MS = 2000;             // how often the open page reloads what it shows
const OVERVIEW_TOPICS_MAX = 200;     // topics whose stats the overview fetches
const HISTORIES_CACHED_MAX = 500;    // topics whose history answers are kept in this tab

let timer = null;
// The broker samples its topics every intervalSeconds (broker/stats_history.py): a
// history answer is asked again only once a new sample can be there.
let histories = new Map();           // "path?samples=..." -> {fetchedAt, answer}
let updatedAt = null;
let peeked = {path: "", text: ""};   // the last peek, shown until another page is opened

function h(tag, attributes, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (name === "onclick") element.addEventListener("click", value);
    else if (value !== undefined && value !== null) element.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

async function api(path, options = {}) {
  // X-Magnetar-Forward: a topic another broker serves is answered through this one
  // (broker/admin/forward.py); the page cannot follow a 307 to another origin.
  const headers = {"Content-Type": "application/json", "X-Magnetar-Forward": "true"};
  const token = sessionStorage.getItem("magnetar.token");
  if (token) headers["Authorization"] = "Bearer " + token;
  const response = await fetch(path, {method: options.method || "GET", headers,
                                      body: options.body === undefined ? undefined : JSON.stringify(options.body)});
  if (!response.ok) {
    let reason = response.statusText;
    try { reason = (await response.json()).reason || reason; } catch (e) { /* not JSON */ }
    throw new Error(`${response.status} ${reason} (${options.method || "GET"} ${path})`);
  }
  if (options.raw) return response;
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

function rate(value, unit) { return `${Number(value || 0).toFixed(1)} ${unit}/s`; }
function bytes(value) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let amount = Number(value || 0), index = 0;
  while (amount >= 1024 && index < units.length - 1) { amount /= 1024; index += 1; }
  return `${amount.toFixed(index ? 1 : 0)} ${units[index]}`;
}
function restPath(topic) { return topic.replace("://", "/"); }
function topicLink(topic) { return h("a", {href: "#/topic/" + restPath(topic)}, topic); }
function backlogOf(stats) {
  return Object.values(stats.subscriptions || {}).reduce((sum, s) => sum + (s.msgBacklog || 0), 0);
}

function setStatus(text, isError, isMessage) {
  const footer = document.getElementById("status");
  footer.textContent = text;
  footer.className = isError ? "error" : "";
  footer.dataset.kind = isError || isMessage ? "message" : "age";
}
function showUpdated() {
  // An error or an action's outcome stays until the next successful refresh.
  const footer = document.getElementById("status");
  if (updatedAt !== null && footer.dataset.kind !== "message") {
    setStatus(`updated ${Math.round((Date.now() - updatedAt) / 1000)} s ago`);
  }
}

function clock(ms) {
  // Local time; the date too when it is not today.
  const date = new Date(ms), pad = (n) => String(n).padStart(2, "0");
  const time = `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  return date.toDateString() === new Date().toDateString() ? time
    : `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ${time}`;
}
function duration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}
// "falling behind since ..." for a behindSince (ms) or null; data-since carries the ms.
// A run that began at the broker's first sample of the subscription may be older.
function behindText(since, firstSample, subscription) {
  if (since === null || since === undefined) return h("span", {"class": "muted", "data-since": ""}, "not falling behind");
  return h("span", {"class": "behind", "data-since": String(since),
                    title: since <= firstSample ? "the broker's first sample of it already saw this backlog grow" : null},
           `falling behind since ${clock(since)}${since <= firstSample ? " or before" : ""} ` +
           `(${duration(Date.now() - since)})` + (subscription ? `: ${subscription}` : ""));
}
function topicBehind(history) {
  const worst = (history.subscriptions || {})[history.behindSubscription];
  return behindText(history.behindSince, worst ? worst.historyStart : null, history.behindSubscription);
}

async function historyOf(path, samples) {
  const key = `${path}?samples=${samples}`;
  const cached = histories.get(key);
  if (cached && Date.now() - cached.fetchedAt < Math.max(REFRESH_MS, cached.answer.intervalSeconds * 1000)) {
    return cached.answer;
  }
  const answer = await api(`/admin/v2/${path}/statsHistory?samples=${samples}`);
  histories.delete(key);
  histories.set(key, {fetchedAt: Date.now(), answer});
  while (histories.size > HISTORIES_CACHED_MAX) histories.delete(histories.keys().next().value);
  return answer;
}

// A line over time: x from the first to the last sample's time, y from 0 to the
// largest value; a sample without a value (a rate's first) breaks the line.
function chart(times, values, field, label, format, width = 300, height = 40) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.dataset.series = field;
  const known = values.filter(v => v !== null && v !== undefined);
  svg.dataset.points = String(known.length);
  const top = Math.max(1, ...known);
  const first = times[0], span = Math.max(1, times[times.length - 1] - first);
  let segment = [];
  const flush = () => {
    if (segment.length === 1) {   // a lone sample: a dot
      const [x, y] = segment[0].split(",");
      const dot = document.createElementNS("http://www.w3.org/2000/svg", "circle");
      dot.setAttribute("cx", x); dot.setAttribute("cy", y); dot.setAttribute("r", "1.5");
      svg.append(dot);
    } else if (segment.length) {
      const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
      line.setAttribute("points", segment.join(" "));
      svg.append(line);
    }
    segment = [];
  };
  values.forEach((v, i) => {
    if (v === null || v === undefined) { flush(); return; }
    const x = times.length > 1 ? ((times[i] - first) / span) * (width - 2) + 1 : width - 1;
    segment.push(`${x.toFixed(1)},${(height - (v / top) * (height - 2) - 1).toFixed(1)}`);
  });
  flush();
  const caption = label ? h("span", {"class": "muted"}, `${label} (max ${format(top)}) `) : null;
  return h("div", {"class": "chart"}, caption, svg);
}

// --- pages ---------------------------------------------------------------------------------------

async function overview(main) {
  const rows = [];
  const namespaces = [];
  const tenants = await api("/admin/v2/tenants");
  let fetched = 0;
  for (const tenant of tenants) {
    for (const namespace of await api(`/admin/v2/namespaces/${tenant}`)) {
      const topics = await api(`/admin/v2/namespaces/${namespace}/topics`);
      namespaces.push(h("li", {"data-namespace": namespace}, `${namespace}: ${topics.length} topics`));
      for (const topic of topics) {
        if (fetched >= OVERVIEW_TOPICS_MAX) break;
        fetched += 1;
        let stats = null;
        try { stats = await api(`/admin/v2/${restPath(topic)}/stats`); } catch (e) { stats = {error: e.message}; }
        rows.push({topic, namespace, stats});
      }
    }
  }
  rows.sort((a, b) => (b.stats.error ? -1 : backlogOf(b.stats)) - (a.stats.error ? -1 : backlogOf(a.stats)));
  // Since when: asked only of the topics with a backlog (the others are not behind).
  for (const row of rows) {
    if (row.stats.error || backlogOf(row.stats) === 0) continue;
    try { row.history = await historyOf(restPath(row.topic), false); } catch (e) { row.history = {error: e.message}; }
  }
  const sinceCell = (row) => {
    const history = row.history;
    if (!history) return h("td", {"data-field": "behind-since"}, behindText(null));
    if (history.error) return h("td", {"data-field": "behind-since", "class": "error"}, history.error);
    if (!history.tracked) return h("td", {"data-field": "behind-since", "class": "muted"}, "no history (past the bound)");
    return h("td", {"data-field": "behind-since"}, topicBehind(history));
  };
  const table = h("table", {id: "topics"},
    h("tr", {}, h("th", {}, "topic"), h("th", {"class": "number"}, "backlog (entries)"),
      h("th", {"class": "number"}, "in"), h("th", {"class": "number"}, "out"),
      h("th", {"class": "number"}, "storage"), h("th", {"class": "number"}, "producers"),
      h("th", {"class": "number"}, "subscriptions"), h("th", {}, "since when")),
    rows.map((row) => { const {topic, stats} = row; return stats.error
      ? h("tr", {"data-topic": topic}, h("td", {}, topicLink(topic)), h("td", {"class": "error", colspan: 7},
          // A partition listed with its partitioned topic but never used has no ledger yet.
          stats.error.startsWith("404 ") ? "not created yet (no producer or consumer used it)" : stats.error))
      : h("tr", {"data-topic": topic},
          h("td", {}, topicLink(topic)),
          h("td", {"class": "number" + (backlogOf(stats) > 0 ? " behind" : ""), "data-field": "backlog"},
            backlogOf(stats)),
          h("td", {"class": "number"}, rate(stats.msgRateIn, "msg")),
          h("td", {"class": "number"}, rate(stats.msgRateOut, "msg")),
          h("td", {"class": "number"}, bytes(stats.storageSize)),
          h("td", {"class": "number"}, (stats.publishers || []).length),
          h("td", {"class": "number"}, Object.keys(stats.subscriptions || {}).length),
          sinceCell(row)); }));
  main.replaceChildren(
    h("h2", {}, `Tenants and namespaces (${tenants.length} tenants)`), h("ul", {id: "namespaces"}, namespaces),
    h("h2", {}, `Topics, most behind first (${rows.length}${fetched >= OVERVIEW_TOPICS_MAX ? ", the first " +
      OVERVIEW_TOPICS_MAX : ""})`), table);
}

async function topicPage(main, path) {
  const topic = path.replace(/^persistent\//, "persistent://");
  const stats = await api(`/admin/v2/${path}/stats`);
  const history = await historyOf(path, true);
  const times = history.timestamps || [];
  const subscriptions = Object.entries(stats.subscriptions || {});
  const subscriptionRows = subscriptions.map(([name, sub]) => {
    const consumers = [...(sub.consumers || [])].sort((a, b) => (b.unackedMessages || 0) - (a.unackedMessages || 0));
    const past = (history.subscriptions || {})[name];
    const subTimes = past ? times.slice(past.firstSampleIndex) : [];
    return h("tr", {"data-subscription": name},
      h("td", {}, name), h("td", {}, sub.type || ""),
      h("td", {"class": "number" + (sub.msgBacklog > 0 ? " behind" : ""), "data-field": "backlog"}, sub.msgBacklog),
      h("td", {"data-field": "behind-since"}, past
        ? [behindText(past.behindSince, past.historyStart),
           chart(subTimes, past.msgBacklog, "msgBacklog", "", String, 160, 24)]
        : h("span", {"class": "muted"}, history.tracked ? "no history yet (or past the bound)" : "no history")),
      h("td", {"class": "number"}, rate(sub.msgRateOut, "msg")),
      h("td", {"class": "number", "data-field": "unacked"}, sub.unackedMessages || 0),
      h("td", {}, consumers.length
        ? consumers.map(c => h("div", {}, `${c.consumerName || "?"}: ${c.unackedMessages || 0} unacked, ` +
                                          `${c.availablePermits} permits, ${c.address || ""}`))
        : h("span", {"class": "behind"}, "no consumer")),
      h("td", {},
        h("button", {"data-action": "peek", onclick: () => peek(path, name)}, "Peek"), " ",
        h("button", {"data-action": "skip-all", onclick: () => act(`/admin/v2/${path}/subscription/${encodeURIComponent(name)}/skip_all`,
                                                                   `skipped the backlog of ${name}`)}, "Skip all"), " ",
        h("input", {"data-field": "reset-minutes", type: "number", min: "0", value: "60", size: "4",
                    title: "minutes back"}),
        h("button", {"data-action": "reset", onclick: (event) => {
          const minutes = Number(event.target.previousSibling.value || 0);
          const timestamp = Date.now() - minutes * 60 * 1000;
          act(`/admin/v2/${path}/subscription/${encodeURIComponent(name)}/resetcursor/${timestamp}`,
              `reset ${name} to ${minutes} min ago`);
        }}, "min ago: reset cursor")));
  });
  main.replaceChildren(
    h("h2", {}, topic),
    h("p", {}, `in ${rate(stats.msgRateIn, "msg")} (${bytes(stats.msgThroughputIn)}/s), out ${rate(stats.msgRateOut, "msg")}, ` +
      `storage ${bytes(stats.storageSize)}, ${(stats.publishers || []).length} producers`),
    h("p", {id: "topic-behind"}, topicBehind(history)),
    historyCharts(history),
    h("h2", {}, "Subscriptions"),
    h("table", {id: "subscriptions"},
      h("tr", {}, h("th", {}, "subscription"), h("th", {}, "type"), h("th", {"class": "number"}, "backlog (entries)"),
        h("th", {}, "since when, backlog over time"), h("th", {"class": "number"}, "out"), h("th", {"class": "number"}, "unacked (msg)"),
        h("th", {}, "consumers (most unacked first)"), h("th", {}, "")),
      subscriptionRows),
    h("pre", {"class": "peek", id: "peek"}, peeked.path === path ? peeked.text : ""));
}

function historyCharts(history) {
  const times = history.timestamps || [];
  if (!history.tracked || !times.length) {
    return h("p", {id: "history", "class": "muted"},
      `No history of this topic yet: the broker samples its loaded topics every ${history.intervalSeconds} s ` +
      `and keeps the ${history.topicsMax} with the largest backlog; a topic that was just loaded or moved here ` +
      "starts anew.");
  }
  const rate1 = (v) => Number(v).toFixed(1);
  return h("div", {id: "history"},
    h("p", {"class": "muted"}, `${times.length} samples, every ${history.intervalSeconds} s, ${clock(times[0])} – ` +
      `${clock(times[times.length - 1])} (the broker keeps ${duration(history.windowSeconds * 1000)}; ` +
      `history here since ${clock(history.historyStart)})`),
    h("div", {"class": "charts"},
      chart(times, history.msgBacklog, "msgBacklog", "backlog (entries)", String),
      chart(times, history.msgRateIn, "msgRateIn", "in (msg/s)", rate1),
      chart(times, history.storageSize, "storageSize", "storage", bytes),
      chart(times, history.msgRateOut, "msgRateOut", "out (msg/s)", rate1)));
}

async function peek(path, subscription) {
  try {
    const response = await api(`/admin/v2/${path}/subscription/${encodeURIComponent(subscription)}/position/1`, {raw: true});
    const text = await response.text();
    peeked = {path, text: `next unacknowledged message of ${subscription} (message id ` +
      `${response.headers.get("X-Pulsar-Message-ID") || "?"}):\n${text.slice(0, 4096)}`};
    document.getElementById("peek").textContent = peeked.text;
  } catch (error) { setStatus(error.message, true); }
}

async function act(path, done) {
  try {
    await api(path, {method: "POST"});
    await render();
    setStatus(done, false, true);
  } catch (error) { setStatus(error.message, true); }
}

async function cluster(main) {
  const sections = [];
  for (const name of await api("/admin/v2/clusters")) {
    const brokers = await api(`/admin/v2/brokers/${name}`);
    let leader = null;
    try { leader = await api("/admin/v2/brokers/leaderBroker"); } catch (e) { /* no bundles layer */ }
    sections.push(h("h2", {}, `Cluster ${name}`),
      h("p", {}, `brokers (admin addresses): ${brokers.join(", ")}` +
        (leader ? `; leader ${leader.brokerId || leader.serviceUrl}` : "")));
  }
  const owners = [];
  for (const tenant of await api("/admin/v2/tenants")) {
    for (const namespace of await api(`/admin/v2/namespaces/${tenant}`)) {
      let bundles = {};
      try { bundles = await api(`/admin/v2/namespaces/${namespace}/bundleOwners`); } catch (e) { continue; }
      for (const [bundle, owner] of Object.entries(bundles)) {
        owners.push(h("tr", {}, h("td", {}, namespace), h("td", {}, bundle), h("td", {}, owner.broker || ""),
                            h("td", {}, owner.state || "")));
      }
    }
  }
  const bookies = (await api("/admin/v2/bookies/all")).bookies;
  const underReplicated = await api("/admin/v2/bookies/underReplicatedLedgers");
  main.replaceChildren(...sections,
    h("h2", {}, "Bundle ownership"),
    h("table", {id: "bundles"}, h("tr", {}, h("th", {}, "namespace"), h("th", {}, "bundle"), h("th", {}, "broker"),
                                  h("th", {}, "state")), owners),
    h("h2", {}, "Bookies"),
    h("table", {id: "bookies"},
      h("tr", {}, h("th", {}, "bookie"), h("th", {}, "state"), h("th", {}, "disk used"), h("th", {"class": "number"}, "free")),
      bookies.map(b => h("tr", {"data-bookie": b.bookieId},
        h("td", {}, b.bookieId), h("td", {"class": b.readOnly ? "behind" : ""}, b.readOnly ? "read-only" : "writable"),
        h("td", {}, h("span", {"class": "bar"}, h("span", {"class": b.diskUsageRatio > 0.85 ? "full" : "",
                                                       style: `width: ${Math.round(b.diskUsageRatio * 100)}%`})),
          ` ${(b.diskUsageRatio * 100).toFixed(1)} %`),
        h("td", {"class": "number"}, bytes(b.freeBytes))))),
    h("h2", {}, "Under-replicated ledgers"),
    h("p", {id: "under-replicated", "class": underReplicated.count ? "behind" : ""},
      `${underReplicated.count} ledgers` + (underReplicated.count ? `: ${underReplicated.ledgers.slice(0, 20).join(", ")}` : "")));
}

// --- routing -------------------------------------------------------------------------------------

async function render() {
  clearTimeout(timer);
  const main = document.getElementById("main");
  const route = location.hash.replace(/^#/, "") || "/";
  try {
    if (route.startsWith("/topic/")) await topicPage(main, route.slice("/topic/".length));
    else if (route === "/cluster") await cluster(main);
    else await overview(main);
    updatedAt = Date.now();
    const footer = document.getElementById("status");
    if (footer.className === "error") footer.dataset.kind = "age";   // recovered: the age again
    showUpdated();
  } catch (error) {
    setStatus(error.message, true);
  }
  timer = setTimeout(render, REFRESH_MS);
}

document.getElementById("token").value = sessionStorage.getItem("magnetar.token") || "";
document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("magnetar.token", document.getElementById("token").value.trim());
  render();
});
window.addEventListener("hashchange", () => { peeked = {path: "", text: ""}; setStatus(""); render(); });
setInterval(showUpdated, 1000);
render();
