"""Shared pytest setup: loads the Helmhive test harness plugin (see ``tests/harness``).

``tests/`` is on ``sys.path`` (pytest's rootdir conftest handling), so test modules
import helpers with ``from harness import wait_for, Kubectl, ...``. ``pytester`` is
enabled for the harness's own tests; ``harness.gitserver`` gives every test real git servers
(``git_daemon``, ``git_http``) on loopback; ``harness.skips`` counts skipped tests and fails the run on a
skip that ``docs/development.md`` does not list.
"""

pytest_plugins = ["harness.plugin", "harness.gitserver", "harness.skips", "pytester"]
