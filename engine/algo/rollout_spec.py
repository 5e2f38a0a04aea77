"""The rollout correction's settings in verl's written forms, parsed without torch: the
config checks them up front (``engine.config.algorithm``) and
``engine.algo.rollout_correction`` computes with what they parse to.

- ``rollout_is_threshold``: a number C (truncated importance sampling: weights capped at
  C), or the text ``"L_U"`` (IcePop: weights outside [L, U] set to 0).
- ``rollout_rs``: rejection-sampling options, comma-separated (every one must pass),
  each a statistic of ρ_t = π_old(o_t) / π_rollout(o_t) named ``LEVEL_kN``: LEVEL is
  ``token`` (per token), ``seq_sum``, ``seq_mean`` or ``seq_max`` (over a sequence's
  tokens), kN the per-token divergence: k1 = −log ρ, k2 = ½(log ρ)², k3 = ρ − 1 − log ρ.
- ``rollout_rs_threshold``: one bound for every option, or one per option, comma-separated.
  A k1 option keeps lower ≤ ρ ≤ upper, given as ``"L_U"`` or as one number U (then
  L = 1/U); k2 and k3 are ≥ 0 and take an upper bound only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

IS_LEVELS = ("token", "sequence")
RS_LEVELS = ("token", "seq_sum", "seq_mean", "seq_max")
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",  # the max of k1 = −log ρ would bound one side only: not offered
    "seq_max_k3",
)
LOSS_TYPES = ("ppo_clip", "reinforce")


@dataclass(frozen=True)
class Bounds:
    """An importance weight's bounds: TIS's cap (``lower`` None) or IcePop's range."""

    lower: float | None
    upper: float


@dataclass(frozen=True)
class RejectionRule:
    """One ``rollout_rs`` option with its bounds: for k1 a range of the ratio (ρ, Π ρ or
    the geometric mean of ρ), for k2 and k3 an upper bound on the divergence."""

    option: str
    lower: float | None
    upper: float

    @property
    def level(self) -> str:
        return self.option.rsplit("_", 1)[0]

    @property
    def estimator(self) -> str:
        return self.option.rsplit("_", 1)[1]


def parse_is_threshold(spec: float | int | str) -> Bounds:
    """``rollout_is_threshold``: C (a number, or numeric text) or ``"L_U"``; ValueError
    with what is wrong."""
    text = str(spec).strip()
    if "_" in text:
        lower, upper = (_number(part, text) for part in text.split("_", 1))
        if not 0 < lower <= upper:
            raise ValueError(f"IcePop's bounds {text!r} need 0 < lower <= upper")
        return Bounds(lower, upper)
    upper = _number(text, text)
    if upper <= 0:
        raise ValueError(f"the cap {text} must be > 0")
    return Bounds(None, upper)


def parse_rejection(
    options: str, thresholds: float | int | str | None
) -> tuple[RejectionRule, ...]:
    """``rollout_rs`` with its ``rollout_rs_threshold``, as rules in the order given
    (a repeated option once); ValueError with what is wrong."""
    names = list(dict.fromkeys(o.strip() for o in options.split(",") if o.strip()))
    if not names:
        raise ValueError("no option given")
    unknown = [n for n in names if n not in RS_OPTIONS]
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; valid: {', '.join(RS_OPTIONS)}")
    if thresholds is None:
        raise ValueError("rollout_rs_threshold is null")
    specs = [t.strip() for t in str(thresholds).split(",") if t.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(
            f"{len(specs)} thresholds for {len(names)} options: give one for all, or one each"
        )
    return tuple(_rule(n, s) for n, s in zip(names, specs * len(names), strict=False))


def _rule(option: str, spec: str) -> RejectionRule:
    if option.endswith("k1"):
        if "_" in spec:
            lower, upper = (_number(part, spec) for part in spec.split("_", 1))
        else:
            upper = _number(spec, spec)
            lower = 1.0 / upper if upper > 0 else 0.0
        if not 0 < lower <= upper:
            raise ValueError(
                f"{option} keeps ratios in [lower, upper]: {spec!r} needs 0 < lower <= upper"
                " (one number U means [1/U, U], so U >= 1)"
            )
        return RejectionRule(option, lower, upper)
    if "_" in spec:
        raise ValueError(f"{option} is a divergence (>= 0): give an upper bound only, not {spec!r}")
    upper = _number(spec, spec)
    if upper <= 0:
        raise ValueError(f"{option}'s upper bound {spec} must be > 0")
    return RejectionRule(option, None, upper)


def _number(text: str, whole: str) -> float:
    if "_" in text:  # Python's float() would read "2_0" as 20
        raise ValueError(f"{whole!r} is not a number or 'lower_upper'")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{whole!r} is not a number or 'lower_upper'") from None
    if not math.isfinite(value):
        raise ValueError(f"{whole!r} is not finite")
    return value
