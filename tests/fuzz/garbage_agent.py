"""A tiny "agent" that answers the runner's ACP requests over stdio with whatever its plan says.

Run as ``python garbage_agent.py``; the plan is JSON in ``FUZZ_AGENT_PLAN``: a list with one
entry per request the client sends (a line with an ``id``). Each entry is a list of actions:

* a string: written as one line, with ``{id}`` replaced by the request's id (JSON-encoded);
* ``{"raw": "..."}``: written as is, encoded with ``surrogateescape`` (so invalid UTF-8 can be sent);
* ``{"stderr": "..."}``: written to stderr;
* ``{"exit": N}``: exit at once with status N;
* ``{"sleep": S}``: sleep S seconds.

Notifications from the client (no ``id``) get no entry. When the plan runs out the agent
exits 0. It never imports Helmhive: it is a separate process speaking (or breaking) the protocol.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    plan = json.loads(os.environ.get("FUZZ_AGENT_PLAN", "[]"))
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict) or "id" not in message or "method" not in message:
            continue
        if not plan:
            sys.exit(0)
        for action in plan.pop(0):
            if isinstance(action, str):
                out.write(action.replace("{id}", json.dumps(message["id"])).encode("utf-8", "surrogateescape") + b"\n")
            elif "raw" in action:
                out.write(action["raw"].encode("utf-8", "surrogateescape"))
            elif "stderr" in action:
                sys.stderr.write(action["stderr"] + "\n")
                sys.stderr.flush()
            elif "exit" in action:
                out.flush()
                sys.exit(int(action["exit"]))
            elif "sleep" in action:
                out.flush()
                time.sleep(float(action["sleep"]))
            out.flush()
    sys.exit(0)


if __name__ == "__main__":
    main()
