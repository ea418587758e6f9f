"""The ``helmhive`` (and ``kubectl-helmhive``) command line: assembles the sub-command groups.

Each group lives in its own module and owns its own options; this module only wires
them together, so adding a group never touches another group's code.
"""

from __future__ import annotations

import typer

from helmhive.cli import (
    change,
    console,
    crds,
    demo,
    dev,
    explain,
    operator_cmd,
    runner_cmd,
    sessions,
    suggestions,
    validate,
)

app = typer.Typer(
    name="helmhive",
    help="Helmhive: declarative governance for AI coding-agent work on Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(crds.app, name="crds")
app.add_typer(dev.app, name="dev")
app.add_typer(operator_cmd.app, name="operator")
app.add_typer(runner_cmd.app, name="runner")
app.add_typer(sessions.app, name="sessions")
app.add_typer(change.app, name="change")
app.add_typer(suggestions.app, name="suggestions")
app.command(name="validate")(validate.run)
app.command(name="demo")(demo.run)
app.command(name="explain-routing")(explain.run)
app.command(name="console")(console.run)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
