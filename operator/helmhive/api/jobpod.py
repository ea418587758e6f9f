"""The job pod's fixed contract, shared by the operator (which writes the pod), the runner (which
drives it) and the programs inside it (``helmhive-jobpod``). Pure: names, ports and paths only.

A job pod (``RunnerPool.spec.execution.mode: JobPod``) has two containers:

- :data:`SHIM_CONTAINER` runs ``helmhive-jobpod shim``: the runner's end of the link. It listens
  on :data:`LINK_PORT`, takes the job's tree and home from the runner, starts the agent through
  the launcher, relays its stdio, hands the tree back, runs the checks, and relays the agent's
  provider requests from the pod's loopback (:data:`EGRESS_RELAY_PORT`) to the runner's proxy
  (:data:`RUNNER_PROXY_PORT`). It alone mounts the link key and its private directory.
- :data:`AGENT_CONTAINER` runs ``helmhive-jobpod agent``: the launcher, which waits on the link
  socket, starts the agent with the environment the runner sent, and relays its stdio. It is the
  container's first process, so every process the agent leaves behind dies with it.

The two share the pod's network namespace, the job volume (:data:`JOB_ROOT`: workspace, home and
tmp, one ``emptyDir`` with the pool's disk limit) and the link directory (:data:`LINK_DIR`); nothing else.
"""

from __future__ import annotations

__all__ = [
    "AGENT_CONTAINER",
    "COMPONENT",
    "EGRESS_RELAY_PORT",
    "JOB_HOME",
    "JOB_ROOT",
    "JOB_TMP",
    "JOB_WORKSPACE",
    "LABEL_JOB",
    "LABEL_POOL",
    "LABEL_RUNNER",
    "LABEL_WARM",
    "LINK_DIR",
    "LINK_KEY_DIR",
    "LINK_KEY_FILE",
    "LINK_KEY_PATH",
    "LINK_PORT",
    "LINK_SECRET_KEY",
    "LINK_SOCKET",
    "RUNNER_LINK_KEY_DIR",
    "RUNNER_PROXY_PORT",
    "SHIM_CONTAINER",
    "SHIM_DIR",
    "link_secret_name",
]

SHIM_CONTAINER = "shim"
AGENT_CONTAINER = "agent"
COMPONENT = "job-pod"
"""``app.kubernetes.io/component`` of every job pod."""

LABEL_POOL = "helmhive.dev/pool"
LABEL_WARM = "helmhive.dev/warm"
"""``"true"`` on a started, unclaimed pod of a pool's warm set."""
LABEL_JOB = "helmhive.dev/job"
"""The AgentJob's name, on a claimed (or cold-started) pod."""
LABEL_RUNNER = "helmhive.dev/runner"
"""The Runner that drives the pod (the job's assignment)."""

LINK_PORT = 7470
"""The shim's TCP port on the job pod's IP: the runner's link (authenticated, see ``docs/execution.md``)."""
RUNNER_PROXY_PORT = 7471
"""The runner pod's port for its job pods' provider requests (phantom key and source address checked)."""
EGRESS_RELAY_PORT = 7472
"""The shim's loopback port in the job pod: the agent's provider base URL, relayed to the runner."""

JOB_ROOT = "/job"
JOB_WORKSPACE = f"{JOB_ROOT}/workspace"
JOB_HOME = f"{JOB_ROOT}/home"
JOB_TMP = f"{JOB_ROOT}/tmp"
LINK_DIR = "/run/helmhive-link"
LINK_SOCKET = f"{LINK_DIR}/agent.sock"
SHIM_DIR = "/shim"
"""The shim's private ``emptyDir`` (the handed-back tree's copy, its own tmp); not mounted in the agent's container."""

LINK_SECRET_KEY = "key"
LINK_KEY_DIR = "/etc/helmhive-link"
LINK_KEY_PATH = f"{LINK_KEY_DIR}/{LINK_SECRET_KEY}"
"""Where the shim reads the pool's link key."""
RUNNER_LINK_KEY_DIR = "/var/run/helmhive/jobpod-link"
LINK_KEY_FILE = f"{RUNNER_LINK_KEY_DIR}/{LINK_SECRET_KEY}"
"""Where the runner reads the same key."""


def link_secret_name(pool: str) -> str:
    """The pool's link-key Secret (made by the operator, mounted by the pool's runners and shims)."""
    return f"{pool}-jobpod-link"
