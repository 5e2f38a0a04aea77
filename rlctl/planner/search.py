"""The search over layouts, tensor/pipeline/context parallel sizes and offload, and the
step-time floor that orders them."""

from __future__ import annotations

from rlctl.hardware import Accelerator
from rlctl.models import ModelShape
from rlctl.planner.fit import (
    CandidateLayout,
    Fit,
    evaluate,
)
from rlctl.planner.memory import TrainCfg
from rlctl.planner.model import (
    ASSUMED_MFU,
    CP_MIN_TOKENS_PER_RANK,
    MAX_NODES,
    NODE_COUNTS,
    InfeasiblePlanError,
    PlanRequest,
)
from rlctl.planner.settings import Settings

# ---------------------------------------------------------------------------
# the search


def flops_per_param_token(s: Settings) -> int:
    """Generation 2, old log-probs 2, update 6 (+2 recompute), reference 2, critic 2 + 6 (+2)."""
    update = 8 if s.grad_ckpt else 6
    total = 2 + 2 + update
    if s.reference:
        total += 2
    if s.critic:
        total += 2 + update
    return total


def step_seconds(m: ModelShape, s: Settings, acc: Accelerator, devices: int) -> float:
    flops = s.samples * s.seq_len * m.compute_params * flops_per_param_token(s)
    return flops / (devices * acc.bf16_tflops * 1e12 * ASSUMED_MFU)


def auto_layouts(per_node: int, max_nodes: int = MAX_NODES) -> list[CandidateLayout]:
    single = sorted({d for d in (1, 2, 4, 8, 16) if d < per_node} | {per_node})
    out = [CandidateLayout(1, d) for d in single]
    out += [CandidateLayout(n, per_node) for n in NODE_COUNTS if n <= max_nodes]
    return out


def fixed_layout(req: PlanRequest, s: Settings, acc_name: str) -> CandidateLayout | None:
    per_node_max = s.per_node or req.max_devices_per_node
    if s.nodes is not None and s.per_node is not None:
        layout = CandidateLayout(s.nodes, s.per_node)
        if req.num_devices is not None and req.num_devices != layout.devices:
            raise InfeasiblePlanError(
                f"num_devices {req.num_devices} disagrees with the pinned trainer.nnodes ×"
                f" trainer.n_gpus_per_node = {s.nodes} × {s.per_node} = {layout.devices}",
                hint="drop one of the two",
            )
        return layout
    if req.num_devices is None:
        if s.nodes is not None:
            return CandidateLayout(s.nodes, per_node_max)
        return None
    d = req.num_devices
    if d <= per_node_max and (s.nodes in (None, 1)):
        return CandidateLayout(1, d)
    if d % per_node_max:
        lower = (d // per_node_max) * per_node_max
        options = " or ".join(str(x) for x in (lower, lower + per_node_max) if x > 0)
        raise InfeasiblePlanError(
            f"{d} devices do not split into nodes of {per_node_max} {acc_name}",
            hint=f"use {options} devices, or up to {per_node_max} on one node",
        )
    return CandidateLayout(d // per_node_max, per_node_max)


def train_options(
    m: ModelShape, s: Settings, layout: CandidateLayout
) -> list[list[list[TrainCfg]]]:
    """Training configurations for a layout: tiers (tried over every layout before the
    next tier), each a list of groups (tried in order; the first group with a fit wins,
    and within a group the fit with the smallest rollout TP, then the least offload)."""
    d = layout.devices

    def allowed(po: bool, oo: bool) -> bool:
        return (s.param_offload in (None, po)) and (s.optimizer_offload in (None, oo))

    offloads = [
        (po, oo) for po, oo in ((False, False), (False, True), (True, True)) if allowed(po, oo)
    ]
    if s.train_backend != "megatron":
        # FSDP: no offload on more devices beats offload on fewer (parameter offload
        # streams every layer from the host); each offload level is its own tier, in which
        # the smallest Ulysses size that fits wins (as the smallest CP does under Megatron).
        return [
            [
                [
                    TrainCfg(
                        s.train_backend,
                        d,
                        po,
                        oo,
                        s.grad_ckpt,
                        sp=sp,
                        logits_chunk=s.logits_chunk,
                        head_share=s.response_len / s.seq_len,
                    )
                ]
                for sp in _ulysses_sizes(m, layout, s)
            ]
            for po, oo in offloads
        ]
    # Megatron: offload only moves state out of the way of the rollout between phases,
    # so every offload level of a (TP, PP, CP) is tried together.
    groups = []
    for tp, pp, cp, ep in _megatron_sizes(m, layout, s.seq_len, s.cp, s.etp):
        cfgs = [
            TrainCfg("megatron", d, po, oo, s.grad_ckpt, tp=tp, pp=pp, ep=ep, etp=s.etp, cp=cp)
            for po, oo in offloads
        ]
        groups.append(cfgs)
    return [groups]


def context_parallel_sizes(seq: int, room: int, pinned: int | None) -> list[int]:
    """CP sizes for samples of ``seq`` tokens when ``room`` devices are left after TP × PP:
    the pinned one, or 1 and the powers of two dividing ``room`` that leave each rank at
    least ``CP_MIN_TOKENS_PER_RANK`` tokens of a sample (shorter chunks leave the GEMMs
    small and the key/value all-gather exposed: CP is for long samples)."""
    if pinned is not None:
        return [pinned] if room % pinned == 0 else []
    sizes, cp = [1], 2
    while room % cp == 0 and seq // cp >= CP_MIN_TOKENS_PER_RANK:
        sizes.append(cp)
        cp *= 2
    return sizes


def _ulysses_sizes(m: ModelShape, layout: CandidateLayout, s: Settings) -> list[int]:
    """Ulysses sizes for FSDP: the pinned one (if it divides the devices); only 1 when
    the recipe pins use_remove_padding=false (Ulysses splits the packed rows); else 1 and
    the powers of two within a node that divide the devices, the query heads and the KV
    heads (each rank attends with whole heads) and leave each rank at least
    ``CP_MIN_TOKENS_PER_RANK`` tokens of a sample (as CP: for long samples only)."""
    if s.sp is not None:
        return [s.sp] if layout.devices % s.sp == 0 else []
    if s.remove_padding is False:
        return [1]
    sizes, sp = [1], 2
    while (
        sp <= layout.per_node
        and layout.devices % sp == 0
        and m.num_attention_heads % sp == 0
        and m.num_kv_heads % sp == 0
        and s.seq_len // sp >= CP_MIN_TOKENS_PER_RANK
    ):
        sizes.append(sp)
        sp *= 2
    return sizes


def _megatron_sizes(
    m: ModelShape,
    layout: CandidateLayout,
    seq: int,
    pinned_cp: int | None = None,
    pinned_etp: int | None = None,
) -> list[tuple[int, int, int, int]]:
    """(TP, PP, CP, EP) to try: TP a power of two within a node dividing the query heads
    and KV heads (Megatron shards query groups), PP up to half the layers where the engine
    can form the stages (``pipeline_stage_layers``: ⌈L/PP⌉ each, the rest on the last),
    CP from ``context_parallel_sizes`` (a power of two dividing D / (TP × PP)), EP the
    largest power of two dividing the experts and D / (ETP × PP) (ETP, the ranks each
    expert is split over, is TP unless the recipe pins expert_tensor_parallel_size; the
    experts' grid ETP × EP × PP must divide D as the dense one does). Smallest TP × PP × CP (the most
    data parallelism) first; at the same size the larger CP (activations scale 1/CP while
    the sequences are long, and its key/value all-gather moves less than TP's
    activations), then the larger TP (TP within a node, PP across nodes)."""
    from engine.schema import pipeline_stage_layers

    d = layout.devices
    sizes = []
    pps = [
        pp
        for pp in range(1, max(1, m.num_layers // 2) + 1)
        if pipeline_stage_layers(m.num_layers, pp) is not None
    ]
    tp = 1
    while tp <= min(layout.per_node, 8):
        heads_ok = m.num_attention_heads % tp == 0 and (
            bool(m.kv_latent_dim) or m.num_kv_heads % tp == 0
        )
        for pp in pps if heads_ok else []:
            etp = tp if pinned_etp is None else pinned_etp
            if d % (tp * pp) == 0 and d % (etp * pp) == 0:
                ep, room = 1, d // (etp * pp)
                while m.is_moe and m.num_experts % (2 * ep) == 0 and room % (2 * ep) == 0:
                    ep *= 2
                for cp in context_parallel_sizes(seq, d // (tp * pp), pinned_cp):
                    sizes.append((tp, pp, cp, ep))
        tp *= 2
    return sorted(sizes, key=lambda x: (x[0] * x[1] * x[2], -x[2], -x[0]))


def _offload_label(c: TrainCfg) -> str:
    if c.param_offload:
        return "parameter offload"
    return "optimizer offload" if c.optimizer_offload else "no offload"


def search_layouts(
    m: ModelShape,
    s: Settings,
    acc: Accelerator,
    layouts: list[CandidateLayout],
) -> tuple[Fit | None, list[str]]:
    """The first layout (in order) with a fit, tier by tier (see ``train_options``)."""
    tried: list[str] = []
    same: dict[str, tuple[int, list[str]]] = {}  # a fixed layout's reason -> (entry, levels)
    options = {lay: train_options(m, s, lay) for lay in layouts}
    for tier in range(max(len(o) for o in options.values())):
        for layout in layouts:
            if tier >= len(options[layout]):
                continue
            if not options[layout][tier] and s.cp is not None:  # megatron: no size fits the pin
                tried.append(
                    f"{layout.describe(acc.name)}: the pinned context_parallel_size {s.cp}"
                    f" does not divide {layout.devices} / (TP × PP) for any TP and PP the model"
                    " allows"
                )
                continue
            if not options[layout][tier] and s.sp is not None:  # fsdp: the pin does not divide
                tried.append(
                    f"{layout.describe(acc.name)}: the pinned ulysses_sequence_parallel_size"
                    f" {s.sp} does not divide {layout.devices} devices"
                )
                continue
            reasons = []
            failed: list[TrainCfg] = []
            for group in options[layout][tier]:
                fits = []
                for cfg in group:
                    fit, why = evaluate(m, s, acc, layout, cfg)
                    if fit is None:
                        reasons.append(why)
                        failed.append(cfg)
                    else:
                        fits.append(fit)
                if fits:
                    return min(fits, key=lambda f: f.rollout.tp), tried
            if not reasons:
                continue
            if len(layouts) == 1:  # a fixed layout: say why each offload level failed
                label = _offload_label(options[layout][tier][0][0])
                index, labels = same.setdefault(reasons[0], (len(tried), []))
                labels.append(label)
                entry = f"{layout.describe(acc.name)}, {' / '.join(labels)}: {reasons[0]}"
                if index < len(tried):  # the same reason at another offload level: once
                    tried[index] = entry
                else:
                    tried.append(entry)
                if s.train_backend != "megatron" and len(failed) > 1:  # and the largest SP
                    last = max(failed, key=lambda f: f.sp)
                    tried.append(
                        f"at the largest Ulysses size tried, SP {last.sp} with"
                        f" {_offload_label(last)}: {reasons[failed.index(last)]}"
                    )
                if s.train_backend == "megatron" and len(failed) > 1:  # and the largest split
                    i = max(
                        range(len(failed)),
                        key=lambda k: (failed[k].model_parallel, failed[k].cp, failed[k].tp, k),
                    )
                    last = failed[i]
                    tried.append(
                        f"at the largest split tried, TP {last.tp} × PP {last.pp} × CP"
                        f" {last.cp} with {_offload_label(last)}: {reasons[i]}"
                    )
            elif not any(t.startswith(layout.describe(acc.name)) for t in tried):
                # the first tier's; under FSDP at the largest Ulysses size tried (the last)
                reason = reasons[-1] if s.train_backend != "megatron" else reasons[0]
                tried.append(f"{layout.describe(acc.name)}: {reason}")
    return None, tried
