"""Run import-linter over both source roots of ``helmhive``.

grimp finds a package's directories with ``importlib.util.find_spec``, which, before the package
is imported, knows only the first source root (``operator/helmhive``). Importing ``helmhive``
first runs its ``extend_path``, which adds ``runner/helmhive`` to the same list, so the
contracts in ``pyproject.toml`` see the runner and the reference agent too. Run it with
``python -P`` (as ``make lint`` does), so that this folder's ``operator.py`` stays off the path.
"""

from __future__ import annotations

import sys

from importlinter.cli import lint_imports_command

import helmhive  # noqa: F401  (joins the second source root before grimp looks)

if __name__ == "__main__":
    sys.exit(lint_imports_command())
