"""The job sandbox: the plan, the job's directory and launcher, Landlock, seccomp, netns, cgroups, limits.

Owns: :mod:`.plan` (pure), :mod:`.workdir` (the job's directory and the launcher), and each
kernel mechanism in a module of its own. Must not: import jobs, sessions, source or egress.
"""
