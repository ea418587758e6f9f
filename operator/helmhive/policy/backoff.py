"""The one capped, jittered exponential backoff of the project. Pure.

Used where many clients retry the same server at once and must not do so in step: the runner's
patience with an unreachable API server (:mod:`helmhive.runner.patience`) and the operator's
AgentJob watch reconnecting (:mod:`helmhive.policy.agentjob.watch`). The caller draws the randomness.
"""

from __future__ import annotations

__all__ = ["decide_jittered_delay"]


def decide_jittered_delay(*, attempt: int, fraction: float, base_s: float, cap_s: float) -> float:
    """Seconds before retry ``attempt`` (0-based): ``fraction`` (in [0, 1]) of min(cap, base * 2**attempt).

    Never below a tenth of the step, so a run of unlucky draws does not spin.
    """
    step: float = min(cap_s, base_s * float(2 ** min(max(attempt, 0), 30)))
    return step * min(1.0, max(0.1, fraction))
