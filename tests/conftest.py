"""Shared pytest setup: loads the Helmhive test harness plugin (see ``tests/harness``).

``tests/`` is on ``sys.path`` (pytest's rootdir conftest handling), so test modules
import helpers with ``from harness import wait_for, Kubectl, ...``. ``pytester`` is
enabled for the harness's own tests.
"""

pytest_plugins = ["harness.plugin", "pytester"]
