"""helmhive-reference-agent: a small deterministic ACP agent over stdio, for tests and the demo. Not a model.

A program of its own (entry point :func:`helmhive.reference_agent.agent.main`). Owns: its
rules (the reply to a prompt), directives, governed-change stages, contract, context, sessions,
and the escape attempts a prompt-injected agent would make.
Must not: import the runner, nor be imported by it (an import-linter contract keeps it so); it
shares only :mod:`helmhive.version`.
"""
