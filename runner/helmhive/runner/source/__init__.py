"""The exact source of a governed change: fetch, git, cache, rules, patches and checks.

Owns: the fetch of one commit (:mod:`.fetch`), how git is run (:mod:`.gitrun`), the cache on
disk (:mod:`.cache`), the pure rules (:mod:`.rules`), patches made by the runner
(:mod:`.patches`), and the checks on the patched tree (:mod:`.checks`).
May import: the sandbox, adapters and logs.
"""
