"""Shared pytest setup: loads the Helmhive test harness plugin (see ``tests/harness``).

``tests/`` is on ``sys.path`` (pytest's rootdir conftest handling), so test modules
import helpers with ``from harness import wait_for, Kubectl, ...``. ``pytester`` is
enabled for the harness's own tests; ``harness.gitserver`` gives every test real git servers
(``git_daemon``, ``git_http``) on loopback; ``harness.skips`` counts skipped tests and fails the run on a
skip that ``docs/development.md`` does not list.
"""

from hypothesis import HealthCheck, settings

pytest_plugins = ["harness.plugin", "harness.gitserver", "harness.skips", "pytester"]

# Property tests run on a loaded 2-core machine (CI shares it): a draw or an example may take
# seconds there. Neither is a property of the code, so no Hypothesis test fails on its timing.
settings.register_profile("helmhive", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("helmhive")
