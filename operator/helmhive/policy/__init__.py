"""The pure core: envelopes, profile narrowing, memory selection, routing, conditions.

Every function here is a function of (spec, observed state, now) that returns data.
Must not: import kopf, kubernetes or httpx, read the clock, or do any I/O.
"""
