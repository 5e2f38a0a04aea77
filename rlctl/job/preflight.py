"""The pre-flight a job runs on every node before the engine starts (``python -m
engine.doctor``), with the checks its plan implies (docs/quickstart.md#before-a-long-run).

    devices   the plan's accelerator, as many as it puts on each node (none on CPU)
    versions  the rollout engine's release (vLLM, SGLang) and megatron-core's, where used
    disk      room for two checkpoints where they are written on the node's disk
    secrets   the recipe's secrets set (by name) in the job's environment
    bucket    the checkpoint bucket written, read back and cleaned
    model     the model's config readable where the engine reads it (not rlctl:tiny's:
              the job builds it)
    network   an all-reduce over the nodes, where there are several (the job script adds
              the node's rank, the node count and rank 0's address)

A failure ends the job with exit 2 before anything of the engine starts, its lines naming
the node, the check and the fix; the supervisor and Slurm's requeue never retry it (exit 2
is a configuration error). ``preflight: false`` in the recipe leaves it out.
"""

from __future__ import annotations

from rlctl.recipe.load import Recipe

# Checkpoint bytes per trained parameter (fp32 weights and Adam's two moments), and the
# checkpoints on disk at once (the last complete one and the one being written).
CHECKPOINT_BYTES_PER_PARAM = 12
CHECKPOINTS_AT_ONCE = 2


def checkpoint_gib(num_params: int) -> float:
    return CHECKPOINT_BYTES_PER_PARAM * num_params * CHECKPOINTS_AT_ONCE / 2**30


def preflight_command(
    recipe: Recipe,
    devices: str | None,
    checkpoints: str,
    num_params: int,
    model: str | None,
    trust_remote_code: bool,
    mounted: bool = False,
) -> tuple[str, ...]:
    """``python -m engine.doctor`` with the plan's checks, the same on every node (the
    job script adds the node's own words); () when the recipe turned it off.
    ``devices``: KIND:COUNT on each node, None on CPU; ``checkpoints``: where the engine
    writes them (a folder or a bucket URL; ``mounted``: a bucket mounted at that folder,
    checked through the mount as the engine writes it); ``num_params``: the trained model's; ``model``: the
    path the engine reads it from, None when the job's setup builds it."""
    if not recipe.preflight:
        return ()
    args = ["python", "-m", "engine.doctor"]
    if devices is not None:
        args.append(f"--devices={devices}")
    if not recipe.is_sft and recipe.rollout != "hf":
        args.append(f"--rollout={recipe.rollout}")
    if recipe.trainer == "megatron":
        args.append("--backend=megatron")
    if mounted or "://" in checkpoints:  # a bucket: no local disk to fill
        args.append(f"--bucket={checkpoints}")
    else:
        args.append(f"--disk={checkpoints}:{checkpoint_gib(num_params):.2f}")
    if recipe.secrets:
        args.append(f"--secrets={','.join(recipe.secrets)}")
    if model is not None:
        args.append(f"--model={model}")
        if trust_remote_code:
            args.append("--trust-remote-code")
    return tuple(args)
