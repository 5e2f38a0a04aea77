"""How ``rlctl plan`` shows a plan to a person."""

from __future__ import annotations

import json

import typer


def show_plan(prepared) -> None:
    plan = prepared.plan
    recipe = prepared.recipe
    where = (
        f"{plan.nodes} node(s) × {plan.devices_per_node} {plan.accelerator}"
        if plan.accelerator
        else f"this machine's CPU, {plan.devices_per_node} worker(s)"
    )
    typer.secho(f"{recipe.name}: {recipe.algorithm} on {recipe.model}", bold=True)
    typer.echo(f"  where:    {where}")
    if plan.split is not None:
        sp = plan.split
        typer.echo(
            f"  split:    training {sp.train_nodes} node(s) × {sp.train_devices_per_node},"
            f" rollout {sp.rollout_nodes} node(s) × {sp.rollout_devices_per_node}"
            f" (async_training.mode={sp.mode})"
        )
    params = plan.model.num_params
    size = f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.2f}M"
    typer.echo(f"  model:    {size} parameters ({plan.model.source})")
    offloaded = (", params offloaded" if plan.param_offload else "") + (
        ", optimizer offloaded" if plan.optimizer_offload else ""
    )
    if recipe.is_sft:  # supervised fine-tuning: no rollout (rlctl/planner/sft.py)
        micro = (
            f"{plan.max_token_len_per_device} tokens"
            if plan.use_dynamic_bsz
            else f"{plan.micro_batch_size_per_device} conversations"
        )
        typer.echo(
            f"  training: {plan.train_backend} (engine.sft), {plan.train_batch_size}"
            f" conversations a step, micro-batches of {micro}/device{offloaded}"
        )
    else:
        typer.echo(
            f"  rollout:  {recipe.rollout}, tensor parallel {plan.rollout_tp}, "
            f"memory fraction {plan.rollout_memory_fraction}"
        )
        typer.echo(
            f"  training: {plan.train_backend}, mini-batch {plan.ppo_mini_batch_size} prompts, "
            f"micro-batch {plan.micro_batch_size_per_device}/device{offloaded}"
        )
    for line in prepared.software:
        typer.echo(f"  {line}")
    memory = plan.to_json().get("memory")
    if memory:
        typer.echo("  memory per device (GiB):")
        for key, value in memory.items():
            typer.echo(f"    {key:28} {value}")
    typer.echo("  reasoning:")
    for line in plan.reasoning:
        typer.echo(f"    - {line}")
    typer.echo("  engine keys set by the plan:")
    typer.echo("    " + json.dumps(plan.engine_overrides(), sort_keys=True))
    for name, content in prepared.files.items():
        typer.secho(f"\n--- {name} ---", bold=True)
        typer.echo(content.rstrip("\n"))
