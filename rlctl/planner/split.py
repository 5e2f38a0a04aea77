"""The rollout on devices of its own (``rollout.placement=separate``, which the
``async_training`` modes one_step_off and fully_async need): how many devices train and
how many generate, the nodes the two groups take, and why (docs/planner.md, "Separate
rollout and asynchronous training").

Every candidate split is checked with the colocated planner's own parts: the training
group as training on that many devices (``evaluate_train``: the same memory model, the
same batch rules), the rollout group as a rollout engine with no training state beside
it (``fit_rollout``: weights and KV in its pool). Among the splits that fit, the one
with the shortest estimated step wins: one_step_off and fully_async overlap generation
with training, so a step takes the longer of the two; sync takes them in turn. The estimates are the
planner's FLOPs model, generation's FLOPs weighted by ``GENERATION_TIME_FACTOR``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from rlctl.hardware import Accelerator
from rlctl.models import ModelShape
from rlctl.planner.explain import assemble, duration_words, reasoning_lines
from rlctl.planner.fit import (
    CandidateLayout,
    Fit,
    RolloutFit,
    count_noun,
    evaluate_train,
    fit_rollout,
    fmt_number,
    fmt_params,
)
from rlctl.planner.memory import TrainMem, budget_bytes, pick_mini
from rlctl.planner.model import (
    ASSUMED_MFU,
    GENERATION_TIME_FACTOR,
    MAX_NODES,
    MAX_THROUGHPUT_NODES,
    InfeasiblePlanError,
    Plan,
    PlanRequest,
)
from rlctl.planner.search import (
    auto_layouts,
    fixed_layout,
    flops_per_param_token,
    train_options,
)
from rlctl.planner.settings import ARR_PREFIX, Settings
from rlctl.planner.split_layout import Split, SplitFit, group_label

# how each async mode overlaps generation with training, as the plan explains it
_OVERLAP = {
    "one_step_off": "batch k+1 is generated while batch k trains",
    "fully_async": "the rollout generates without stopping while the actor trains",
}

_NOTHING = TrainMem(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # no training state on the rollout's
_KEYS = (  # the split's keys, in the order a reader names them
    ("trainer.nnodes", "nodes", "train", "nodes"),
    ("trainer.n_gpus_per_node", "per_node", "train", "per_node"),
    (f"{ARR_PREFIX}.rollout.separate_nnodes", "rollout_nodes", "rollout", "nodes"),
    (f"{ARR_PREFIX}.rollout.separate_n_gpus_per_node", "rollout_per_node", "rollout", "per_node"),
)


def separate_plan(req: PlanRequest, s: Settings, m: ModelShape, acc: Accelerator) -> Plan:
    """The plan with the rollout on devices of its own; raises ``InfeasiblePlanError``
    with the reason and what would fit."""
    node_size = req.max_devices_per_node  # the hardware's node (8 for auto)
    one = _one_device_seconds(m, s, acc)
    pinned = _pinned_split(s, node_size)
    fixed = _hardware(req, s, acc)
    floor = 1
    if pinned is not None:
        _check_pinned(pinned, fixed, acc.name)
        groups = [[pinned]]
    elif fixed is not None:
        groups = [_candidates(fixed, s, node_size)]
        if not groups[0]:
            raise _no_candidate(s, fixed.describe(acc.name))
    else:
        # Auto: the step-time floor for a step of both phases at a balanced split.
        floor = min(math.ceil(sum(one) / s.target_s), MAX_THROUGHPUT_NODES * node_size)
        everything = [lay for lay in auto_layouts(node_size) if lay.devices >= 2]
        totals = [lay for lay in everything if lay.devices >= floor] or everything[-1:]
        groups = [g for g in (_candidates(lay, s, node_size) for lay in totals) if g]
        if not groups:
            raise _no_candidate(s, f"up to {MAX_NODES} nodes of {acc.name}")
    fits, tried = _search_splits(m, s, acc, groups)
    if not fits:
        raise _infeasible(req, s, m, acc, fixed, pinned, groups, tried)
    best = _choose(fits)
    layout_lines = _split_lines(s, m, acc, best, fits, tried, one, floor, fixed)
    chosen = best.fit
    lines = reasoning_lines(
        s, m, acc, chosen, [], 0.0, floor, auto=False, layout_lines=layout_lines
    )
    plan = assemble(s, m, acc, chosen, lines, 0.0)
    job = best.split.job()
    return replace(
        plan,
        nodes=job.nodes,
        devices_per_node=job.per_node,
        # nothing of the training stays where the rollout generates
        memory=replace(plan.memory, rollout_resident_gib=0.0),
        estimated_step_seconds=round(best.step_s, 1),
        split=best.split.in_plan(s.async_mode, round(best.generate_s, 1), round(best.train_s, 1)),
    )


# ---------------------------------------------------------------------------
# candidates


def _hardware(req: PlanRequest, s: Settings, acc: Accelerator) -> CandidateLayout | None:
    """The devices the recipe's hardware gives the job (both groups), or None (auto)."""
    if req.num_devices is None:
        return None
    # trainer.nnodes / n_gpus_per_node size the training group here, not the job
    return fixed_layout(req, replace(s, nodes=None, per_node=None), acc.name)


def _pinned_split(s: Settings, node_size: int) -> Split | None:
    if None in (s.nodes, s.per_node, s.rollout_nodes, s.rollout_per_node):
        return None
    return Split(
        CandidateLayout(s.nodes or 1, s.per_node or 1),
        CandidateLayout(s.rollout_nodes or 1, s.rollout_per_node or 1),
        node_size,
    )


def _candidates(total: CandidateLayout, s: Settings, node_size: int) -> list[Split]:
    """The splits of ``total`` that use all of it and keep the recipe's pins: every node
    shared (r of its devices generate, the rest train), or whole nodes for each group."""
    n, p = total.nodes, total.per_node
    out = [Split(CandidateLayout(n, p - r), CandidateLayout(n, r), node_size) for r in range(1, p)]
    out += [Split(CandidateLayout(n - k, p), CandidateLayout(k, p), node_size) for k in range(1, n)]
    return [c for c in out if all(_value(c, k) == v for k, v in _pins(s).items())]


def _pins(s: Settings) -> dict[str, int]:
    """The split's keys the recipe pinned, with their values."""
    return {key: getattr(s, attr) for key, attr, _, _ in _KEYS if getattr(s, attr) is not None}


def _value(c: Split, key: str) -> int:
    for k, _, group, part in _KEYS:
        if k == key:
            return int(getattr(getattr(c, group), part))
    raise KeyError(key)


def _check_pinned(c: Split, fixed: CandidateLayout | None, acc_name: str) -> None:
    """A split the recipe pinned whole: each group's devices per node within a node, and
    the nodes it takes within the recipe's hardware."""
    for lay, key in ((c.train, "trainer.n_gpus_per_node"),
                     (c.rollout, f"{ARR_PREFIX}.rollout.separate_n_gpus_per_node")):  # fmt: skip
        if lay.per_node > c.node_size:
            raise InfeasiblePlanError(
                f"{key} {lay.per_node} is more than the {c.node_size} devices a node has",
                hint=f"use at most {c.node_size} devices per node, and more nodes",
            )
    job = c.job()
    if fixed is None or job.nodes <= fixed.nodes:
        return
    t, r = c.train.per_node, c.rollout.per_node
    if c.shares_nodes:
        why = (
            f"{t} + {r} ≤ {c.node_size} devices share each node, on"
            f" max({c.train.nodes}, {c.rollout.nodes}) nodes"
        )
    else:
        why = (
            f"{t} + {r} > {c.node_size} devices per node, so each group takes nodes of its"
            f" own: {c.train.nodes} + {c.rollout.nodes}"
        )
    room = c.node_size - t
    hints = [f"use hardware.nodes: {job.nodes}"]
    if room >= 1 and max(c.train.nodes, c.rollout.nodes) <= fixed.nodes and not c.shares_nodes:
        hints.insert(
            0,
            f"set {ARR_PREFIX}.rollout.separate_n_gpus_per_node {room} ({t} + {room} ="
            f" {c.node_size}: the groups then share each node)",
        )
    hints.append("unpin the four keys and let the planner split")
    raise InfeasiblePlanError(
        f"the pinned split, {c.describe()} (trainer.nnodes × trainer.n_gpus_per_node +"
        f" {ARR_PREFIX}.rollout.separate_nnodes × {ARR_PREFIX}.rollout.separate_n_gpus_per_node), needs"
        f" {count_noun(job.nodes, 'node')} ({why}); the recipe's hardware is"
        f" {fixed.describe(acc_name)}",
        hint="; or ".join(hints),
    )


def _no_candidate(s: Settings, where: str) -> InfeasiblePlanError:
    pins = _pins(s)
    if not pins:
        return InfeasiblePlanError(
            f"{where} cannot be split between training and the rollout's own devices: each"
            " group needs at least one",
            hint="give the job at least 2 devices (hardware.accelerators), or keep the rollout"
            " colocated (async_training.mode=sync, rollout.placement=colocate)",
        )
    pinned = ", ".join(f"{k} {v}" for k, v in pins.items())
    return InfeasiblePlanError(
        f"no split of {where} between training and the rollout's own devices keeps the"
        f" pinned {pinned} (each group gets at least one device; a node is shared, r of its"
        " devices generating, or each group takes whole nodes)",
        hint=f"unpin {', '.join(pins)} and let the planner split, or change the hardware",
    )


def cpu_split(s: Settings, total: CandidateLayout) -> Split:
    """The CPU quickstart's split of its workers: no time model there (a CPU has no
    FLOPS figure in the table), so the rollout takes the fewest workers a split allows
    (the HF rollout generates on one as well as on several) and training the rest;
    a split the recipe pins is taken as it is."""
    pinned = _pinned_split(s, total.per_node)
    if pinned is not None:
        _check_pinned(pinned, total, "CPU")
        return pinned
    candidates = _candidates(total, s, total.per_node)
    if not candidates:
        raise _no_candidate(s, total.describe("CPU workers"))
    return min(candidates, key=lambda c: (c.rollout.devices, c.train.nodes))


def cpu_split_lines(s: Settings, c: Split) -> list[str]:
    how = "pinned by the recipe" if len(_pins(s)) == len(_KEYS) else "the fewest for the rollout"
    return [
        f"placement: the rollout on workers of its own (async_training.mode={s.async_mode})",
        f"split: {c.train.devices} train + {c.rollout.devices} generate ({c.label}) — {how}"
        " (no time model on CPU)",
        _nodes_line(c, "CPU workers", None, unit="workers"),
    ]


# ---------------------------------------------------------------------------
# the search and the rule


def _search_splits(
    m: ModelShape, s: Settings, acc: Accelerator, groups: list[list[Split]]
) -> tuple[list[SplitFit], list[tuple[Split, str]]]:
    """The splits that fit in the first group of candidates (one group per total layout,
    smallest first) where any does, tier by tier like the colocated search (no offload on
    more devices before offload on fewer); and why the others did not."""
    budget = budget_bytes(acc)
    rollouts: dict[CandidateLayout, tuple[RolloutFit | None, str]] = {}
    options: dict[CandidateLayout, list] = {}  # the training configurations of a group, once

    def options_of(lay: CandidateLayout) -> list:
        if lay not in options:
            options[lay] = train_options(m, s, lay)
        return options[lay]

    # every layout has as many tiers (offload levels) as the settings allow
    tiers = len(train_options(m, s, groups[0][0].train))
    reasons: dict[Split, str] = {}
    for tier in range(tiers):
        for group in groups:
            fits = []
            for c in group:
                fit, why = _evaluate_split(m, s, acc, c, options_of, tier, budget, rollouts)
                if fit is not None:
                    fits.append(fit)
                elif why and (c not in reasons or why.startswith("rollout")):
                    # the first tier's reason; but a rollout that does not fit is the
                    # reason at every tier (offload frees only the training's devices)
                    reasons[c] = why
            if fits:
                fitted = {f.split for f in fits}
                return fits, [(c, reasons[c]) for c in group if c in reasons and c not in fitted]
    return [], list(reasons.items())


def _evaluate_split(
    m: ModelShape,
    s: Settings,
    acc: Accelerator,
    c: Split,
    options_of: Callable[[CandidateLayout], list],
    tier: int,
    budget: float,
    rollouts: dict[CandidateLayout, tuple[RolloutFit | None, str]],
) -> tuple[SplitFit | None, str]:
    if s.samples % c.rollout.devices:  # the engine hands each rollout rank an equal share
        return None, (
            f"rollout: the {s.samples} samples of a batch ({s.train_batch} prompts × {s.n}) do"
            f" not split evenly over {c.rollout.devices} generating devices"
        )
    mini, why = pick_mini(s, c.train.devices)
    if why:  # said shortly: every split of a layout is listed with its reason
        if s.mini is not None:
            return None, (
                f"training: the pinned ppo_mini_batch_size {s.mini} × rollout.n {s.n} ="
                f" {s.mini * s.n} samples do not split evenly over {c.train.devices} devices"
            )
        return None, (
            f"training: no mini-batch of the {s.train_batch} prompts × {s.n} samples splits"
            f" evenly over {c.train.devices} devices"
        )
    options = options_of(c.train)
    if tier >= len(options):
        return None, ""
    if not options[tier] and s.cp is not None:
        return None, (
            f"training: the pinned context_parallel_size {s.cp} does not divide"
            f" {c.train.devices} / (TP × PP) for any TP and PP the model allows"
        )
    if not options[tier] and s.sp is not None:
        return None, (
            f"training: the pinned ulysses_sequence_parallel_size {s.sp} does not divide"
            f" {c.train.devices} devices"
        )
    why = ""
    for group in options[tier]:
        for cfg in group:  # the least offload first
            trained, reason = evaluate_train(m, s, c.train, cfg, budget)
            if trained is None:
                why = why or reason
                continue
            if c.rollout not in rollouts:
                rollouts[c.rollout] = fit_rollout(m, s, acc, c.rollout, _NOTHING, budget)
            rollout, reason = rollouts[c.rollout]
            if rollout is None:
                return None, reason if reason.startswith("rollout") else f"rollout: {reason}"
            if rollout.tp > c.rollout.per_node and c.shares_nodes:
                return None, (
                    f"rollout: TP {rollout.tp} would span nodes that hold"
                    f" {count_noun(c.rollout.per_node, 'rollout device')} each"
                )
            mini, train = trained
            gen, tr = _split_seconds(m, s, acc, c)
            step = max(gen, tr) if s.async_mode != "sync" else gen + tr
            return SplitFit(c, Fit(c.train, cfg, mini, train, rollout), gen, tr, step), ""
    return None, f"training: {why}" if why else ""


def _one_device_seconds(m: ModelShape, s: Settings, acc: Accelerator) -> tuple[float, float]:
    """(generation, training) of one step on one device: the planner's FLOPs (2 to
    generate; old log-probs, update, reference and critic to train), generation's weighted
    by ``GENERATION_TIME_FACTOR``, at ``ASSUMED_MFU`` of the device's bf16 peak."""
    work = s.samples * s.seq_len * m.compute_params
    rate = acc.bf16_tflops * 1e12 * ASSUMED_MFU
    generate = work * 2 * GENERATION_TIME_FACTOR / rate
    train = work * (flops_per_param_token(s) - 2) / rate
    return generate, train


def _split_seconds(m: ModelShape, s: Settings, acc: Accelerator, c: Split) -> tuple[float, float]:
    generate, train = _one_device_seconds(m, s, acc)
    return generate / c.rollout.devices, train / c.train.devices


def _choose(fits: list[SplitFit]) -> SplitFit:
    """The shortest estimated step; at a tie (within 0.1 %), the fewer rollout devices
    (more for training's memory), then the training group on fewer nodes (its
    collectives stay within nodes)."""
    best = min(f.step_s for f in fits)
    tied = [f for f in fits if f.step_s <= best * 1.001]
    return min(tied, key=lambda f: (f.split.rollout.devices, f.split.train.nodes))


# ---------------------------------------------------------------------------
# the explanation


def _split_lines(
    s: Settings,
    m: ModelShape,
    acc: Accelerator,
    best: SplitFit,
    fits: list[SplitFit],
    tried: list[tuple[Split, str]],
    one: tuple[float, float],
    floor: int,
    fixed: CandidateLayout | None,
) -> list[str]:
    c = best.split
    overlap = s.async_mode != "sync"
    train_parts = f"old log-probs 2, update {8 if s.grad_ckpt else 6}"
    train_parts += ", reference 2" if s.reference else ""
    train_parts += f", critic {2 + (8 if s.grad_ckpt else 6)}" if s.critic else ""
    gen_1, train_1 = one
    lines = [
        _placement_line(s),
        f"step compute: {s.train_batch} prompts × {s.n} samples × {s.seq_len} tokens ="
        f" {s.samples * s.seq_len / 1e6:.2f}M tokens × {fmt_params(m.compute_params)}"
        f"{' active' if m.is_moe else ''} params; generation 2 FLOPs × {GENERATION_TIME_FACTOR:g}"
        " (decoding is bound by memory bandwidth and waits for the longest response: about"
        f" {GENERATION_TIME_FACTOR:g}× training's time per FLOP) = {duration_words(gen_1)}, training"
        f" {flops_per_param_token(s) - 2} FLOPs ({train_parts}) = {duration_words(train_1)}, on one"
        f" {acc.name} at {ASSUMED_MFU:.0%} of {acc.bf16_tflops:g} TFLOPS (upper bounds: every"
        " response at its maximum length)",
    ]
    if floor > 1:
        lines.append(
            f"step-time floor: a step under {s.target_s / 60:g} min needs ≥ {floor} devices in all"
        )
    combine = "max" if overlap else "sum"
    pins = _pins(s)
    if len(pins) == len(_KEYS):
        how = "pinned by the recipe"
    else:
        how = "the split with the shortest estimated step" + (
            f" that keeps the pinned {', '.join(f'{k} {v}' for k, v in pins.items())}"
            if pins
            else ""
        )
    where = fixed.describe(acc.name) if fixed is not None else c.job().describe(acc.name)
    line = (
        f"split: {c.train.devices} train + {c.rollout.devices} generate on {where} — {how},"
        f" {combine}(generate {duration_words(best.generate_s)} on {c.rollout.devices}, train"
        f" {duration_words(best.train_s)} on {c.train.devices}) = {duration_words(best.step_s)}"
    )
    shown = [
        (f.split, f"{combine}({duration_words(f.generate_s)}, {duration_words(f.train_s)}) ="
                  f" {duration_words(f.step_s)}" + _tie(f, best))
        for f in fits if f is not best
    ]  # fmt: skip
    shown += tried[:4]
    if shown:
        shown.sort(key=lambda x: (x[0].rollout.devices, x[0].train.nodes))
        line += "; the others: " + "; ".join(f"{c.label}: {text}" for c, text in shown)
        if len(tried) > 4:
            line += f"; and {len(tried) - 4} more that do not fit"
    lines.append(line)
    if overlap and best.generate_s > best.train_s * 1.001:
        lines.append(
            f"note: generation ({duration_words(best.generate_s)}) outlasts training"
            f" ({duration_words(best.train_s)}): the training waits for each batch"
            " (timing_s/wait_prev_gen); more devices for the rollout shorten it"
        )
    lines.append(_nodes_line(c, acc.name, fixed))
    when = "once per step, before it generates the next batch" if overlap else "after every update"
    lines.append(
        f"weights: the actor's first rank sends the bf16 weights ({fmt_number(2 * m.num_params)}) to"
        f" the rollout's {count_noun(c.rollout.devices, 'device')} {when}, bucket by bucket"
        f" ({ARR_PREFIX}.rollout.update_weights_bucket_megabytes; docs/async.md); not in the estimate"
    )
    return lines


def _placement_line(s: Settings) -> str:
    if s.async_mode != "sync":
        return (
            f"placement: the rollout on devices of its own (async_training.mode={s.async_mode}:"
            f" {_OVERLAP[s.async_mode]}, so a step takes the longer of the two; docs/async.md)"
        )
    return (
        "placement: the rollout on devices of its own (rollout.placement=separate,"
        " async_training.mode=sync: generation and training take turns, so a step takes"
        " both; one_step_off or fully_async would overlap them)"
    )


def _nodes_line(c: Split, what: str, fixed: CandidateLayout | None, unit: str = "devices") -> str:
    """The nodes the job asks for: verl's rule (``job_nodes``) with the numbers."""
    job = c.job()
    if c.shares_nodes:
        nodes = (
            f"nodes: {c.train.per_node} + {c.rollout.per_node} ≤ {c.node_size} {unit} per node,"
            f" so the groups share nodes: max({c.train.nodes}, {c.rollout.nodes}) ="
            f" {count_noun(job.nodes, 'node')} × {job.per_node}"
        )
    else:
        nodes = (
            f"nodes: {c.train.per_node} + {c.rollout.per_node} > {c.node_size} {unit} per node,"
            f" so each group takes nodes of its own: {c.train.nodes} + {c.rollout.nodes} ="
            f" {count_noun(job.nodes, 'node')} × {job.per_node}"
        )
    nodes += (
        f" {what} for the job (training {group_label(c.train)}, rollout {group_label(c.rollout)})"
    )
    used = c.train.devices + c.rollout.devices
    if job.devices > used:  # a node's request is what its busiest node holds
        nodes += f"; {job.devices - used} of the {unit} it asks for stay idle"
    if fixed is not None and fixed.devices > job.devices:
        nodes += f"; the recipe's hardware gives {fixed.devices}, {job.devices} of them used"
    return nodes


def _tie(f: SplitFit, best: SplitFit) -> str:
    if f.step_s > best.step_s * 1.001:
        return ""
    if f.split.rollout.devices > best.split.rollout.devices:
        return " (a tie: the fewer rollout devices win)"
    return " (a tie: the training group on fewer nodes wins)"


# ---------------------------------------------------------------------------
# no split fits


def _infeasible(
    req: PlanRequest,
    s: Settings,
    m: ModelShape,
    acc: Accelerator,
    fixed: CandidateLayout | None,
    pinned: Split | None,
    groups: list[list[Split]],
    tried: list[tuple[Split, str]],
) -> InfeasiblePlanError:
    if pinned is not None:
        where = f"the pinned split, {pinned.describe()}"
    elif fixed is not None:
        where = f"any split of {fixed.describe(acc.name)}"
    else:
        where = f"any split of up to {MAX_NODES} nodes of {acc.name}"
    shown = tried if len(tried) <= 4 else [*tried[:2], *tried[-2:]]
    message = f"{m.name} with the rollout on devices of its own does not fit on {where}: " + (
        "; ".join(f"{c.label}: {why}" for c, why in shown) or "nothing to try"
    )
    hints: list[str] = []
    pins = _pins(s)
    if pins:
        free = replace(s, nodes=None, per_node=None, rollout_nodes=None, rollout_per_node=None)
        totals = [fixed] if fixed is not None else [g[0].job() for g in groups]
        retry = [_candidates(t, free, req.max_devices_per_node) for t in totals]
        fits, _ = _search_splits(m, free, acc, [g for g in retry if g])
        there = f" (fits as {_choose(fits).split.describe()})" if fits else ""
        hints.append(f"unpin {', '.join(pins)} and let the planner split{there}")
    if fixed is not None or pinned is not None:
        free = replace(s, nodes=None, per_node=None, rollout_nodes=None, rollout_per_node=None)
        node_size = req.max_devices_per_node
        auto = [lay for lay in auto_layouts(node_size) if lay.devices >= 2]
        fits, _ = _search_splits(
            m, free, acc, [g for g in (_candidates(t, free, node_size) for t in auto) if g]
        )
        given = fixed if fixed is not None else pinned.job() if pinned is not None else None
        if fits and given is not None and _choose(fits).split.job().devices > given.devices:
            best = _choose(fits).split
            hints.append(f"needs ~{best.job().describe(acc.name)} ({best.describe()})")
    hints.append(
        f"shorten the sequences (now {s.prompt_len} + {s.response_len} tokens), or use an"
        " accelerator with more memory"
    )
    return InfeasiblePlanError(message, hint="; or ".join(hints))
