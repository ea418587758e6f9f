"""The HTML of the profiles page and the audit page, from their page models. Pure.

Kept apart from :mod:`helmhive.console.html` (the overview, job and change pages) and built with
its helpers: every string from an object is escaped. The audit search is a plain GET form (labels,
a select and a submit button: usable with the keyboard alone); its answer is a page like any other.
"""

from __future__ import annotations

from helmhive.console.audit_view import AuditPage
from helmhive.console.html import _pairs, e, error_box, table
from helmhive.console.profile_view import ProfileBlock, ProfilesPage

__all__ = ["render_audit", "render_profiles"]

ASPECTS = [
    ("aspect", "Aspect"),
    ("envelope", "Envelope (the bound)"),
    ("profile", "Profile asks"),
    ("effective", "In effect"),
    ("narrowed", "Narrowed"),
]
REVISIONS = [
    ("revision", "Revision"),
    ("name", "Name"),
    ("hash", "Hash"),
    ("created", "Created"),
    ("current", "Current"),
]
RECORDS = [
    ("time", "Time"),
    ("action", "Action"),
    ("object", "Object"),
    ("actor", "Actor"),
    ("before", "Before"),
    ("after", "After"),
    ("message", "Message"),
    ("details", "Details"),
]


def _profile(block: ProfileBlock) -> str:
    pid = f"profile-{block.name}"
    valid = block.valid
    kind = "ok" if valid.get("status") == "True" else "warn"
    out = [
        f'<section id="{e(pid)}"><h2>{e(block.name)} <small>envelope {e(block.envelope)}</small></h2>',
        error_box(
            f"Valid: {valid.get('status', '')} {valid.get('reason', '')}: {valid.get('message', '')}".rstrip(": "),
            kind=kind,
        ),
    ]
    if block.envelope_note:
        out.append(f'<p class="note">{e(block.envelope_note)}</p>')
    out.append(_pairs("Profile", block.summary).replace("<h2>", "<h3>").replace("</h2>", "</h3>"))
    out.append(
        table(
            f"{block.name}: envelope and narrowing",
            ASPECTS,
            [{**r, "id": r["aspect"].replace(" ", "-")} for r in block.aspects],
            row_id=f"{pid}-",
            id_key="id",
        )
    )
    out.append(table(f"{block.name}: revisions (newest first)", REVISIONS, block.revisions))
    out.append("</section>")
    return "".join(out)


def render_profiles(page: ProfilesPage) -> str:
    out = [f"<h1>Profiles <small>namespace {e(page.namespace)}</small></h1>"]
    out += [error_box(p, kind="warn") for p in page.problems]
    if not page.profiles:
        out.append('<p class="empty">no profiles</p>')
    out += [_profile(b) for b in page.profiles]
    return "".join(out)


def _field(name: str, label: str, value: str, kind: str = "text") -> str:
    return (
        f'<label>{e(label)} <input type="{e(kind)}" name="{e(name)}" id="audit-{e(name)}" value="{e(value)}"></label> '
    )


def render_audit(page: AuditPage) -> str:
    q = page.query
    options = "".join(
        f'<option value="{e(a)}"{" selected" if a == q.action else ""}>{e(a or "any")}</option>'
        for a in ["", *page.actions]
    )
    out = [
        f"<h1>Audit <small>namespace {e(page.namespace)}</small></h1>",
        '<form method="get" action="/audit" id="audit-search" role="search">',
        _field("object", "Object (Kind/name)", q.object),
        _field("actor", "Actor", q.actor),
        f'<label>Action <select name="action" id="audit-action">{options}</select></label> ',
        _field("since", "From (UTC)", q.since),
        _field("until", "To (UTC)", q.until),
        '<button type="submit" id="audit-go">Search</button> <a href="/audit">clear</a></form>',
    ]
    out += [error_box(p, kind="warn") for p in page.problems]
    shown = len(page.records)
    more = f", the newest {shown} shown" if page.matched > shown else ""
    out.append(f'<p id="audit-count">{page.matched} of {page.total} records match{e(more)}.</p>')
    out.append(table("Audit records, newest first", RECORDS, page.records, row_id="audit-"))
    return "".join(out)
