"""The rollout's side of MoE routing replay R3: the HF rollout records each token's experts
while it generates, and they are those a training forward over the same tokens takes;
vLLM is asked for its routed experts and its per-request output becomes the same ragged
rows. (vLLM's CPU builds cannot return routed experts: 0.32's capture needs its Model
Runner V2, which needs Triton's CPU backend, absent from the build; 0.27's refuses the
CPU MoE kernel, which would give all-zero ids. So the vLLM engine itself is not run
here; the config refuses R3 with vLLM on CPU, tests/engine/test_config_routing_replay.py.)"""

from types import SimpleNamespace

import numpy as np
import torch

from engine.config import load_config
from engine.config.routing_replay import RECORD
from engine.models.router_tap import RouterTap
from engine.models.tiny import random_model, tiny_config
from engine.rollout.hf import HFRollout
from engine.rollout.translate import engine_args_for
from engine.rollout.vllm_outputs import routed_experts
from engine.train.forward import response_logprobs
from engine.train.routing_replay import RoutingReplay
from engine.types import GenerationRequest, SamplingParams, TokenBatch

CPU = torch.device("cpu")
EOS, PAD = 2, 0


def test_hf_rollout_records_the_routing_training_takes():
    cfg = tiny_config("qwen3_moe", vocab_size=256, hidden_size=64, num_layers=2, num_experts=8)
    model = random_model(cfg, seed=3).eval()
    rollout = HFRollout(
        model, SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD), CPU, routing=True
    )
    prompts = [[5, 9, 31, 7], [40, 41], [11, 12, 13, 14, 15, 16]]  # left-padded to 6
    torch.manual_seed(0)
    out = rollout.generate(
        GenerationRequest(prompts, SamplingParams(max_new_tokens=6, temperature=1.0))
    )
    assert len(out.routed_experts) == 3
    for prompt, response, routed in zip(prompts, out.response_ids, out.routed_experts, strict=True):
        # the last token drawn never ran forward (unless its row ended before the others)
        assert len(prompt) + len(response) - 1 <= len(routed) <= len(prompt) + len(response)
        assert routed.shape[1:] == (2, 2) and routed.dtype == torch.int16
    tokens = TokenBatch.from_ragged(
        prompts, out.response_ids, PAD, routed_experts=out.routed_experts
    )
    tap = RouterTap(model).install()
    training = RoutingReplay(tap, tap.num_layers)
    with torch.no_grad(), training.during(RECORD) as recorded:
        response_logprobs(model, tokens, CPU, packed=True, routing=training)
    rollout_routed = tokens.routed_experts_BSLK
    both = rollout_routed >= 0  # the positions the rollout recorded
    assert both.any(-1).any(-1).sum() == sum(len(r) for r in out.routed_experts)
    assert torch.equal(recorded.routed_experts_BSLK[both], rollout_routed[both])


def test_vllm_is_asked_for_routed_experts_and_its_rows_are_cut_to_the_tokens(tmp_path):
    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={tmp_path}",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
            "actor_rollout_ref.actor.router_replay.mode=R3",
        ],
        check=False,
    )
    rollout = cfg.actor_rollout_ref.rollout
    args = engine_args_for(rollout, str(tmp_path), 1, backend="vllm", max_model_len=64)
    assert args["enable_return_routed_experts"] is True and args["enable_prefix_caching"]
    # vLLM's RequestOutput: [tokens it ran, layers, k] from the first prompt token; the
    # response is cut after EOS by the engine (finish_row), the routing with it
    ran = np.arange(9 * 2 * 2, dtype=np.int32).reshape(9, 2, 2) % 8
    output = SimpleNamespace(
        prompt_token_ids=[1, 2, 3, 4], outputs=[SimpleNamespace(routed_experts=ran)]
    )
    kept = routed_experts(output, response_len=3)
    assert kept.dtype == torch.int16 and torch.equal(kept, torch.from_numpy(ran[:7]).short())
