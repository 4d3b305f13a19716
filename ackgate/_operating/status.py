"""What ``GET /status.json`` says of each service, and the status page ``GET /`` that
shows it.

The page is one self-contained HTML document (no framework, no external resource):
a few lines of JavaScript fetch ``/status.json`` every :data:`REFRESH_SECONDS`
seconds and draw one table per service (a workers' parent's ``/status.json`` has one
entry per worker, each with its services). Without JavaScript the page still
reloads itself (``<noscript>`` meta refresh) and links the JSON.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ackgate._service.handlers import ServiceStats

#: Seconds between two refreshes of the status page.
REFRESH_SECONDS = 2


def service_status(stats: ServiceStats) -> dict[str, Any]:
    """``stats`` as JSON: state, upstream, the oldest message, lag, per-handler counts.

    Caller: the services' loop (through the health server's probes)."""
    group = stats.group
    oldest = stats.oldest
    lag = None if group is None else group.broker_lag
    return {
        "service": str(stats.key),
        "state": stats.state,
        "live": group is not None,
        "restarts": stats.restarts,
        "upstream_connected": None if group is None else group.upstream_connected,
        "upstream_down_since": None if group is None else group.upstream_down_since,
        "paused": None if group is None else group.paused,
        "missing": [] if group is None else [str(member) for member in group.missing],
        "outstanding": 0 if group is None else group.outstanding,
        "oldest": None
        if oldest is None
        else {
            "lane": _text(oldest.lane),
            "key": None if oldest.key is None else _text(oldest.key),
            "id": oldest.id,
            "handlers": list(oldest.handlers),
            "age": round(oldest.age, 3),
        },
        "lag": None
        if lag is None
        else {
            "total": lag.total,
            "lanes": {_text(lane): value for lane, value in lag.lanes.items()},
            "waiting": lag.waiting,
            "in_flight": lag.in_flight,
            "measured_at": lag.measured_at,
        },
        "handlers": [
            {
                "handler": handler.id,
                "handled": handler.handled,
                "rejected": handler.rejected,
                "failed": handler.failed,
                "gave_up": handler.gave_up,
                "in_progress": handler.in_progress,
                "behind": handler.behind,
            }
            for handler in stats.handlers.values()
        ],
    }


def _text(value: Any) -> str:
    """A lane or key for JSON and labels: a str as it is, bytes decoded, else repr."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return repr(value)


STATUS_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>ackgate status</title>
<noscript><meta http-equiv="refresh" content="{REFRESH_SECONDS}"></noscript>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; margin: .4em 0 1.2em; }}
th, td {{ border: 1px solid #ccc; padding: .2em .6em; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
.bad {{ color: #b00; font-weight: bold; }} .ok {{ color: #080; font-weight: bold; }}
h2 {{ margin: .8em 0 .2em; font-size: 1.1em; }} small {{ color: #666; }}
</style></head>
<body>
<h1>ackgate <span id="overall">…</span></h1>
<p><small>Refreshed every {REFRESH_SECONDS}s from <a href="/status.json">/status.json</a>;
<span id="updated">not yet</span>.</small></p>
<div id="services"></div>
<script>
"use strict";
function el(tag, text, cls) {{
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}}
function row(cells, head) {{
  const tr = el("tr");
  for (const cell of cells) tr.appendChild(el(head ? "th" : "td", cell));
  return tr;
}}
function drawService(parent, s, worker) {{
  const box = el("section"); box.className = "service"; box.dataset.service = s.service;
  const up = s.upstream_connected === false ? "upstream LOST" : "upstream connected";
  const title = (worker === undefined ? "" : "worker " + worker + ": ") + "service " + s.service;
  box.appendChild(el("h2", title));
  const state = s.state + (s.live ? "" : " (no live group)") + ", " + up
    + (s.paused ? ", paused: missing " + s.missing.join(", ") : "")
    + ", restarts " + s.restarts + ", outstanding " + s.outstanding;
  box.appendChild(el("p", state, s.upstream_connected === false || s.paused ? "bad" : ""));
  const o = s.oldest;
  box.appendChild(el("p", o ? "oldest message: " + o.id + " lane " + o.lane + " key " + o.key
    + ", " + o.age.toFixed(1) + "s old, held by " + (o.handlers.join(", ") || "(advancing)")
    : "oldest message: none", "oldest"));
  if (s.lag) box.appendChild(el("p", "broker lag: " + s.lag.total
    + (s.lag.in_flight === null ? "" : " (in flight " + s.lag.in_flight + ")"), "lag"));
  const table = el("table");
  table.appendChild(row(["handler", "handled", "rejected", "failed", "gave up", "DLQ",
    "in progress", "behind"], true));
  for (const h of s.handlers) table.appendChild(row([h.handler, h.handled, h.rejected,
    h.failed, h.gave_up, h.rejected + h.gave_up, h.in_progress, h.behind]));
  box.appendChild(table);
  parent.appendChild(box);
}}
async function refresh() {{
  const target = document.getElementById("services");
  try {{
    const reply = await fetch("/status.json", {{cache: "no-store"}});
    const body = await reply.json();
    target.replaceChildren();
    const overall = document.getElementById("overall");
    overall.textContent = body.status;
    overall.className = body.status === "ok" ? "ok" : "bad";
    if (body.workers) {{
      for (const w of body.workers) {{
        if (!w.services) target.appendChild(el("h2", "worker " + w.worker + ": "
          + (w.reason || "not running"), "bad"));
        else for (const s of w.services) drawService(target, s, w.worker);
      }}
    }} else for (const s of body.services || []) drawService(target, s);
    document.getElementById("updated").textContent = "last at " + new Date().toLocaleTimeString();
  }} catch (error) {{
    document.getElementById("updated").textContent = "refresh failed: " + error;
  }}
}}
refresh();
setInterval(refresh, {REFRESH_SECONDS * 1000});
</script>
</body></html>
""".encode()
