"""``helmhive crds generate|check|print``: write the generated files from the models, or fail on drift.

Generated: the CRDs in ``crds/`` and, wrapped as Helm templates, in the chart's
``charts/helmhive/templates/crds/`` (the rest of the chart is written by hand);
``docs/api-reference.md``; and the envelope table inside ``docs/envelopes.md``.
``check`` exits 1 and lists every file that is missing, different or stray.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from helmhive.api.crdgen import build_crds, render_crd_yaml
from helmhive.deploy.chart import CHART_CRD_DIR, build_chart_files
from helmhive.deploy.reference import (
    ENVELOPE_TABLE_BEGIN,
    ENVELOPE_TABLE_END,
    render_api_reference,
    render_envelope_table,
    splice_generated,
)

app = typer.Typer(no_args_is_help=True, help="Generate the CRDs from the API models, or check them.")

CHART = Path("charts/helmhive")
CRD_DIRS = (Path("crds"),)
# Directories that hold only generated YAML: anything else there is stray. The chart's crds/
# must stay empty (Helm would install it once and never upgrade it; the CRDs are templates).
GENERATED_DIRS = (Path("crds"), CHART / CHART_CRD_DIR, CHART / "crds")
RootOption = Annotated[
    Path, typer.Option("--root", help="Repository root that holds crds/ and charts/.", file_okay=False)
]


ENVELOPES_DOC = Path("docs/envelopes.md")


def build_crd_files() -> dict[Path, str]:
    """Return every generated CRD file, keyed by its path relative to the repository root."""
    rendered = {name: render_crd_yaml(crd) for name, crd in build_crds().items()}
    return {directory / name: text for directory in CRD_DIRS for name, text in rendered.items()}


def build_generated_files(root: Path) -> dict[Path, str]:
    """Every generated file (CRDs and docs), keyed by path relative to ``root``."""
    files = build_crd_files()
    files.update({CHART / rel: text for rel, text in build_chart_files().items()})
    files[Path("docs/api-reference.md")] = render_api_reference()
    envelope_doc = root / ENVELOPES_DOC
    if envelope_doc.is_file():
        current = envelope_doc.read_text(encoding="utf-8")
        try:
            files[ENVELOPES_DOC] = splice_generated(
                current, render_envelope_table(), begin=ENVELOPE_TABLE_BEGIN, end=ENVELOPE_TABLE_END
            )
        except ValueError:
            files[ENVELOPES_DOC] = current + "\n" + render_envelope_table() + "\n"
    return files


def decide_drift(root: Path) -> list[str]:
    """Return one line per drifted file under ``root`` (empty when everything matches)."""
    expected = build_generated_files(root)
    problems: list[str] = []
    for rel, text in sorted(expected.items()):
        path = root / rel
        if not path.is_file():
            problems.append(f"missing: {rel}")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"differs: {rel}")
    for directory in GENERATED_DIRS:
        for path in sorted((root / directory).glob("*.yaml")):
            if path.relative_to(root) not in expected:
                problems.append(f"stray: {path.relative_to(root)}")
    return problems


@app.command()
def generate(root: RootOption = Path(".")) -> None:
    """Write crds/, the chart's CRD templates and the generated docs from the models."""
    expected = build_generated_files(root)
    for rel, text in expected.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            typer.echo(f"wrote {rel}")
    for directory in GENERATED_DIRS:
        for path in (root / directory).glob("*.yaml"):
            if path.relative_to(root) not in expected:
                path.unlink()
                typer.echo(f"removed stray {path.relative_to(root)}")


@app.command()
def check(root: RootOption = Path(".")) -> None:
    """Exit 1 if crds/, the chart's CRD templates or the generated docs differ from the models."""
    problems = decide_drift(root)
    if problems:
        for line in problems:
            typer.echo(line, err=True)
        typer.echo("CRDs drifted from the models: run `helmhive crds generate`.", err=True)
        raise typer.Exit(1)
    typer.echo(f"CRDs match the models ({len(build_crds())} kinds).")


@app.command("print")
def print_crds() -> None:
    """Print every CRD as one multi-document YAML stream (for `kubectl apply -f -`)."""
    docs = [render_crd_yaml(crd) for crd in build_crds().values()]
    sys.stdout.write("---\n".join(docs))
