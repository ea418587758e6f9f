"""``helmhive console``: a web view of pools, runners, jobs and changes, served on 127.0.0.1 (docs/console.md).

Pure page models (:mod:`.view`, :mod:`.html`, :mod:`.diff`), the reads and the one write with the
user's own credentials (:mod:`.pages`), the live updates (:mod:`.hub`) and the HTTP server
(:mod:`.server`); the command is :mod:`helmhive.cli.console`.
"""
