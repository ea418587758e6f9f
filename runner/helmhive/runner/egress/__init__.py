"""The runner's egress proxy: the provider credential stays in the runner process.

Owns: the proxy (:mod:`.proxy`), its pure rules (:mod:`.rules`: where a request goes, which
headers it carries), per-job limits (:mod:`.limits`), and where Codex finds it (:mod:`.codex_config`).
May import: the sandbox's plan, logs and metrics.
"""
