"""The console's HTML: each page model (:mod:`helmhive.console.view`) rendered to a string. Pure.

Every string from an object is escaped here (:func:`html.escape`), so text written by an agent or
a user is shown, never interpreted. A page is a ``<main>`` body (what the live updates replace)
inside :func:`layout`; the script and the style sheet are the package's own files, served
from ``/static/`` (no CDN, no remote font).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from urllib.parse import quote

from helmhive.console.change_view import ChangePage
from helmhive.console.diff import render_diff
from helmhive.console.view import JobPage, Overview, Row

__all__ = ["error_box", "layout", "render_change", "render_job", "render_memory", "render_overview"]


Columns = list[tuple[str, str]]
CONDITIONS: Columns = [("type", "Type"), ("status", "Status"), ("reason", "Reason"), ("message", "Message")]
JOBS: Columns = [("name_html", "Job"), ("kind", "Kind"), ("reason", "Reason"), ("message", "Why"), ("runner", "Runner")]
CANDIDATES: Columns = [
    ("runner", "Runner"),
    ("namespace", "Namespace"),
    ("provider", "Provider"),
    ("model", "Model"),
    ("reason", "Reason"),
]
EVENTS: Columns = [("type", "Type"), ("reason", "Reason"), ("message", "Message"), ("count", "Count")]
CHECKS: Columns = [
    ("name", "Check"),
    ("outcome", "Outcome"),
    ("exit", "Exit"),
    ("seconds", "Seconds"),
    ("tail", "Output tail"),
]


def e(value: object) -> str:
    return escape("" if value is None else str(value))


def link(kind: str, namespace: str, name: str) -> str:
    href = f"/{kind}/{quote(namespace, safe='')}/{quote(name, safe='')}"
    return f'<a href="{e(href)}">{e(name)}</a>'


def table(
    caption: str, columns: Sequence[tuple[str, str]], rows: Iterable[Row], *, row_id: str = "", id_key: str = "name"
) -> str:
    """A table of ``rows``: ``columns`` are (key, heading); a cell whose key ends in ``_html`` is markup.

    With ``row_id``, each row's id is ``row_id`` followed by its ``id_key`` value (for links and tests).
    """
    head = "".join(f'<th scope="col">{e(title)}</th>' for _, title in columns)
    body = []
    for row in rows:
        cells = "".join(
            f'<td data-col="{e(key)}">{row.get(key, "") if key.endswith("_html") else e(row.get(key, ""))}</td>'
            for key, _ in columns
        )
        rid = f' id="{e(row_id + row.get(id_key, ""))}"' if row_id else ""
        body.append(f"<tr{rid}>{cells}</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(columns)}" class="empty">none</td></tr>')
    return (
        f'<div class="scroll" tabindex="0"><table><caption>{e(caption)}</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
    )


def error_box(message: str, *, kind: str = "error") -> str:
    """A clear message on the page (a refusal, a deleted object, a lost API server)."""
    return f'<div class="msg {e(kind)}" role="alert">{e(message)}</div>'


def layout(title: str, main: str, *, flash: str = "") -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · Helmhive console</title>"
        '<link rel="stylesheet" href="/static/console.css"></head><body>'
        '<a class="skip" href="#main">Skip to content</a>'
        '<header><nav aria-label="console"><a href="/">Helmhive console</a> · <a href="/memory">Memory</a> · '
        '<a href="/profiles">Profiles</a> · <a href="/audit">Audit</a></nav>'
        '<div id="live" role="status" aria-live="polite">connecting to live updates…</div></header>'
        f'<div id="flash">{flash}</div>'
        f'<main id="main" tabindex="-1">{main}</main>'
        '<script src="/static/console.js"></script></body></html>'
    )


def render_overview(page: Overview) -> str:
    out = [f"<h1>Overview <small>namespace {e(page.namespace)}</small></h1>"]
    out += [error_box(p, kind="warn") for p in page.problems]
    out.append(
        table(
            "Runner pools",
            [
                ("namespace", "Namespace"),
                ("name", "Pool"),
                ("provider", "Provider"),
                ("replicas", "Replicas"),
                ("mode", "Execution"),
                ("ready", "Ready"),
                ("message", "Message"),
            ],
            page.pools,
        )
    )
    out.append(
        table(
            "Runners",
            [
                ("namespace", "Namespace"),
                ("name", "Runner"),
                ("pool", "Pool"),
                ("control", "Control"),
                ("reported", "Reported"),
                ("schedulable", "Schedulable"),
                ("auth", "Auth"),
                ("models", "Models"),
                ("capacity", "In use"),
                ("credentialIsolation", "Credential isolation"),
                ("network", "Network"),
                ("qualified", "Qualified"),
                ("qualification", "Qualification"),
            ],
            page.runners,
            row_id="runner-",
        )
    )
    out.append("<h2>Jobs by state</h2>")
    if not page.jobs_by_state:
        out.append('<p class="empty">no jobs</p>')
    for state, rows in page.jobs_by_state.items():
        linked = [{**r, "name_html": link("jobs", r["namespace"], r["name"])} for r in rows]
        out.append(
            table(
                f"{state} ({len(rows)})",
                JOBS,
                linked,
                row_id="job-",
            )
        )
    changes = [{**r, "name_html": link("changes", r["namespace"], r["name"])} for r in page.changes]
    out.append(
        table(
            "Changes",
            [
                ("name_html", "Change"),
                ("title", "Title"),
                ("approval", "Approval"),
                ("iteration", "Iteration"),
                ("state", "State"),
                ("message", "Message"),
            ],
            changes,
            row_id="change-",
        )
    )
    return "".join(out)


def render_memory(namespace: str, rows: list[Row], problems: list[str]) -> str:
    out = [f"<h1>Memory records <small>namespace {e(namespace)}</small></h1>"]
    out += [error_box(p, kind="warn") for p in problems]
    columns = [
        ("name", "Record"),
        ("workspace", "Workspace"),
        ("scope", "Scope"),
        ("kind", "Kind"),
        ("sensitivity", "Sensitivity"),
        ("expires", "Expires"),
        ("active", "Active"),
        ("why", "Why not"),
    ]
    out.append(table("Memory records (their text is not shown)", columns, rows, row_id="memory-"))
    return "".join(out)


def _pairs(title: str, row: Row) -> str:
    items = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in row.items() if v)
    return f"<section><h2>{e(title)}</h2><dl>{items or '<dd>none</dd>'}</dl></section>"


def render_job(page: JobPage) -> str:
    out = [f"<h1>Job {e(page.namespace)}/{e(page.name)} <small>{e(page.row['state'])}</small></h1>"]
    if page.row["message"]:
        out.append(error_box(f"{page.row['reason']}: {page.row['message']}", kind="info"))
    out.append(table("Conditions", CONDITIONS, page.conditions))
    decision = page.decision
    out.append("<section><h2>Routing</h2>")
    if decision["outcome"]:
        out.append(
            f'<p id="decision">Decision (fresh, as explain-routing): <b>{e(decision["outcome"])}</b> '
            f"{e(decision['reason'])}: {e(decision['message'])}</p>"
        )
    if page.routing_note:
        out.append(error_box(page.routing_note, kind="warn"))
    out.append(
        table(
            "Candidates, with each one's reason",
            CANDIDATES,
            page.candidates,
            row_id="cand-",
            id_key="runner",
        )
    )
    out.append("</section>")
    out.append(_pairs("Assignment", page.assignment))
    out.append(_pairs("Profile", page.profile))
    if page.snapshot:
        out.append(f'<details><summary>Profile snapshot</summary><pre class="snap">{e(page.snapshot)}</pre></details>')
    named = "".join(f"<li>{e(m)}</li>" for m in page.memory_ids) or "<li>none</li>"
    injected = "".join(f"<li>{e(m)}</li>" for m in page.memory_injected) or "<li>none reported</li>"
    dropped = "".join(f"<li>{e(d['name'])}: {e(d['reason'])}</li>" for d in page.memory_dropped)
    out.append(
        '<section><h2>Memory</h2><h3>Named at routing</h3><ul id="memory">'
        f"{named}</ul><h3>Injected by the runner</h3><ul>{injected}</ul>"
        + (f"<h3>Dropped</h3><ul>{dropped}</ul>" if dropped else "")
        + "</section>"
    )
    out.append(_pairs("Session binding", page.session))
    out.append(_pairs("Result", page.result))
    out.append(table("Events", EVENTS, page.events))
    return "".join(out)


def render_change(page: ChangePage, *, patch_html: str, patch_note: str) -> str:
    out = [f"<h1>Change {e(page.namespace)}/{e(page.name)} <small>{e(page.state['state'])}</small></h1>"]
    out.append(f"<p>{e(page.title)} · approval {e(page.approval_mode)} · iteration {e(page.state['iteration'])}</p>")
    if page.state["message"]:
        out.append(error_box(page.state["message"], kind="info"))
    stages = [{**s, "job_html": link("jobs", page.namespace, s["job"])} for s in page.stages]
    out.append(
        table(
            "Stages",
            [
                ("stage", "Stage"),
                ("iteration", "Iteration"),
                ("job_html", "Job"),
                ("runner", "Runner"),
                ("provider", "Provider"),
                ("model", "Model"),
                ("outcome", "Outcome"),
            ],
            stages,
            row_id="stage-",
            id_key="job",
        )
    )
    out.append(table("Conditions", CONDITIONS, page.conditions))
    out.append('<section id="plan"><h2>Plan</h2>')
    if page.plan:
        out.append(f'<p>Digest <code id="plan-digest">{e(page.plan["digest"])}</code></p>')
        out.append(f'<p class="summary">{e(page.plan["summary"])}</p>')
        steps = "".join(f"<li><b>{e(s['title'])}</b> {e(s['detail'])}</li>" for s in page.plan_steps)
        out.append(f"<ol>{steps}</ol>")
        if page.can_approve:
            out.append(
                f'<form method="post" action="/changes/{e(quote(page.namespace, safe=""))}/'
                f'{e(quote(page.name, safe=""))}/approve">'
                f'<input type="hidden" name="digest" value="{e(page.plan["digest"])}">'
                f'<button type="submit" id="approve">Approve plan {e(page.plan["digest"][:19])}…</button></form>'
            )
    else:
        out.append('<p class="empty">no plan yet</p>')
    out.append("</section>")
    if page.approval:
        out.append(
            f'<p id="approval">Approved by <b>{e(page.approval["by"])}</b> at {e(page.approval["at"])}: '
            f"<code>{e(page.approval['digest'])}</code></p>"
        )
    out.append("<section><h2>Patch</h2>")
    if page.patch:
        out.append(
            f"<p>sha256 <code>{e(page.patch['sha256'])}</code>, {e(page.patch['bytes'])} bytes, "
            f'{e(page.patch["files"])} file(s) · <a href="/changes/{e(quote(page.namespace, safe=""))}/'
            f'{e(quote(page.name, safe=""))}/patch">raw</a></p>'
        )
    if patch_note:
        out.append(error_box(patch_note, kind="warn"))
    out.append(patch_html or '<p class="empty">no patch yet</p>')
    out.append("</section>")
    out.append(table("Checks", CHECKS, page.checks))
    out.append(_pairs("Review", page.review))
    out.append(table("Criteria", [("criterion", "Criterion"), ("met", "Met"), ("note", "Note")], page.criteria))
    out.append(table("Findings", [("severity", "Severity"), ("where", "Where"), ("message", "Finding")], page.findings))
    return "".join(out)


def render_patch(text: str) -> str:
    return render_diff(text)
