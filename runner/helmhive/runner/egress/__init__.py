"""The runner's egress proxy: the provider credential stays in the runner process.

Owns: the proxy (:mod:`.proxy`), its pure rules (:mod:`.rules`: where a request goes, which
headers it carries), jobs' own listeners (:mod:`.listeners`), the job pods' shared listener and
their phantom keys (:mod:`.pods`), the upstream client (:mod:`.upstream`), per-job limits
(:mod:`.limits`), and where Codex finds it (:mod:`.codex_config`).
May import: the sandbox's plan, logs and metrics.
"""
