"""The real vLLM engine driven through VLLMRollout, in a process of its own.

Run by test_vllm_engine.py as ``python vllm_checks.py SCENARIO[,SCENARIO] MODEL_DIR
OUT.json``: vLLM's CPU worker replaces ``torch.set_num_threads`` for the whole process and
initialises torch.distributed, so it must not share the pytest process. This script only
*records* (token ids, log-probs, errors); the tests make the comparisons. Scenarios named
together run in order in one process, into one record: only where at most one of them
starts an engine (on the oldest build ``lora`` is refused before its engine starts).

Scenarios:
- ``main``: greedy and sampled generation against the HF model and its training
  forward; a weight update pushed as the actor pushes it; then a sync that leaves a
  parameter out.
- ``interrupted``: a sync whose stream fails part-way (the actor's gather failing).
- ``lora``: the engine serving a LoRA adapter (``lora_as_adapter``): a sample streamed
  across an adapter swap, and the log-probs of each adapter's model (peft) on it.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def _single_process_dist() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def _training_logprobs(model, prompts, responses, temperature=1.0, top_k=0):
    """log p(token) as the training forward computes it at ``temperature``; with
    ``top_k``, renormalised over the k most likely tokens (the distribution sampled)."""
    import torch

    from engine.types import TokenBatch

    tokens = TokenBatch.from_ragged(prompts, responses, 0)
    with torch.no_grad():
        logits = model(
            input_ids=tokens.input_ids_BS,
            attention_mask=tokens.attention_mask_BS,
            position_ids=tokens.position_ids_BS,
        ).logits.float()
    r = tokens.response_length
    logits = logits[:, -r - 1 : -1] / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    logp = torch.log_softmax(logits, -1).gather(-1, tokens.responses_BR.unsqueeze(-1))
    return [logp[i, : len(row), 0].tolist() for i, row in enumerate(responses)]


def _streamed(rollout, prompts, sampling):
    """The prompts through the turn stream (multi-turn's path): the first half submitted
    at once, each of the rest only when a turn has finished (requests join a running
    engine); the completions by prompt."""
    done = {}
    with rollout.turn_stream() as stream:
        half = len(prompts) // 2
        handles = {stream.submit(p, sampling): i for i, p in enumerate(prompts[:half])}
        waiting = list(range(half, len(prompts)))
        while len(done) < len(prompts):
            for completion in stream.step():
                done[handles[completion.handle]] = completion
                if waiting:
                    i = waiting.pop(0)
                    handles[stream.submit(prompts[i], sampling)] = i
    rows = [done[i] for i in range(len(prompts))]
    return {
        "response_ids": [c.token_ids for c in rows],
        "finished": [c.finished for c in rows],
        "logprobs": [c.logprobs for c in rows],
    }


def _samples(done):
    return {
        "response_ids": [d.response_ids for d in done],
        "finished": [d.finished for d in done],
        "logprobs": [d.logprobs for d in done],
        "versions": [d.versions for d in done],
    }


def _rows(output):
    return {
        "response_ids": output.response_ids,
        "finished": output.finished,
        "logprobs": output.logprobs,
    }


def main(scenarios: str, model_dir: str, out_path: str) -> None:
    _single_process_dist()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.config import RolloutConfig
    from engine.rollout.hf import HFRollout
    from engine.rollout.translate import EngineSettings
    from engine.types import GenerationRequest, SamplingParams

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hf = HFRollout(model, tokenizer, torch.device("cpu"))
    prompts = [[1, 40, 41, 42], [1, 50, 51], [1, 60], [7, 8, 9, 10, 11]]
    greedy = SamplingParams(do_sample=False, max_new_tokens=10)
    # An EOS id that greedy decoding of the first prompt reaches at its 4th token, so
    # that cutting at EOS (and finished=True) is exercised beside length-capped rows.
    probe = hf.generate(GenerationRequest(prompts, greedy)).response_ids[0]
    eos = set(hf.eos_token_ids) | {probe[3]}
    hf.eos_token_ids = eos
    from engine.versions import installed_version

    results: dict = {"eos": sorted(eos), "vllm_version": installed_version("vllm")}

    cfg = RolloutConfig(
        name="vllm", dtype="float32", calculate_log_probs=True, enforce_eager=True
    )  # free_cache_engine stays true: on CPU the engine must decide "no sleep mode"
    settings = EngineSettings(
        model_dir,
        eos_token_ids=frozenset(eos),
        max_model_len=128,
        load_format="dummy",  # as the rollout role builds it: weights come from the actor
        kv_cache_bytes=64 * 2**20,
        bucket_bytes=256 * 1024,  # several buckets for the tiny model
        # a model.override_config field (the tiny config's is 2048): the engine's config has it
        hf_overrides={"max_position_embeddings": 4096},
    )
    scenario = {
        "main": _main_scenario,
        "interrupted": _interrupted_scenario,
        "lora": _lora_scenario,
    }
    for name in scenarios.split(","):
        scenario[name](cfg, settings, model, hf, prompts, greedy, results)
    _write(out_path, results)


def _push(rollout, source_model) -> None:
    """What the FSDP actor hands the rollout: HF checkpoint names, the tied lm_head left
    out (engine.rollout.weights skips it; vLLM must tie it itself)."""
    import torch

    from engine.rollout.weights import full_tensors

    rollout.sleep()
    rollout.sync_weights(full_tensors(source_model, dtype=torch.float32))
    rollout.wake()


def _teacher_scores(rollout, model, prompts, responses, results) -> None:
    """A distillation teacher's scores of whole samples (``prompt_logprobs``) beside the
    HF model's own (``engine.train.forward.response_topk``, what the hf teacher runs)."""
    import torch

    from engine.train.forward import response_topk
    from engine.types import TokenBatch

    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    scored = rollout.prompt_logprobs(seqs, [len(p) for p in prompts], 3)
    results["teacher_vllm"] = [[sampled, best] for sampled, best in scored]
    tokens = TokenBatch.from_ragged(prompts, responses, 0)
    logp, values, ids = response_topk(model, tokens, torch.device("cpu"), 3)
    results["teacher_hf"] = [
        [logp[i, : len(r)].tolist(), values[i, : len(r)].tolist(), ids[i, : len(r)].tolist()]
        for i, r in enumerate(responses)
    ]


def _interrupted_scenario(cfg, settings, model, hf, prompts, greedy, results) -> None:
    import torch

    from engine.rollout.vllm import VLLMRollout
    from engine.rollout.weights import full_tensors
    from engine.types import GenerationRequest

    rollout = VLLMRollout(cfg, settings)
    _push(rollout, model)

    def failing_stream():
        for i, pair in enumerate(full_tensors(model, dtype=torch.float32)):
            if i == 12:
                raise RuntimeError("the actor's all-gather failed")
            yield pair

    try:
        rollout.sync_weights(failing_stream())
    except Exception as error:
        results["sync_error"] = [type(error).__name__, str(error)]
    try:
        rollout.generate(GenerationRequest(prompts, greedy))
        results["generate_after"] = "generated"
    except Exception as error:
        results["generate_after"] = [type(error).__name__, str(error)]


def _main_scenario(cfg, settings, model, hf, prompts, greedy, results) -> None:
    import torch

    from engine.rollout.vllm import VLLMRollout
    from engine.rollout.weights import full_tensors
    from engine.types import GenerationRequest, SamplingParams

    rollout = VLLMRollout(cfg, settings)
    hf_config = rollout.llm.llm_engine.model_config.hf_config
    results["engine_max_position_embeddings"] = hf_config.max_position_embeddings
    _push(rollout, model)
    results["hf_greedy"] = _rows(hf.generate(GenerationRequest(prompts, greedy)))
    got = rollout.generate(GenerationRequest(prompts, greedy))
    results["vllm_greedy"] = _rows(got)
    results["stream_greedy"] = _streamed(rollout, prompts, greedy)
    results["train_logprobs_greedy"] = _training_logprobs(model, prompts, got.response_ids)
    _teacher_scores(rollout, model, prompts, got.response_ids, results)

    for name, sampling, top_k in [
        ("t07", SamplingParams(temperature=0.7, max_new_tokens=10), 0),
        ("t07_topk5", SamplingParams(temperature=0.7, top_k=5, max_new_tokens=10), 5),
    ]:
        out = rollout.generate(GenerationRequest(prompts * 4, sampling))
        results[f"vllm_{name}"] = _rows(out)
        results[f"train_logprobs_{name}"] = _training_logprobs(
            model, prompts * 4, out.response_ids, temperature=0.7, top_k=top_k
        )

    # The fully asynchronous mode's stream: every prompt at once, run to the end...
    from engine.rollout.stream import StreamItem

    stream = rollout.sample_stream()
    stream.add([StreamItem(i, p) for i, p in enumerate(prompts)], greedy)
    done = {}
    while stream.in_flight:
        done |= {d.uid: d for d in stream.step(version=0)}
    results["sample_stream_greedy"] = _samples([done[i] for i in range(len(prompts))])
    # ...and one left in flight (a partial rollout) across the next update
    stream.add([StreamItem(99, prompts[1])], greedy)
    for _ in range(3):
        assert stream.step(version=0) == []

    # A weight update as training makes one, pushed as the actor pushes it.
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    rollout.sync_weights(full_tensors(model, dtype=torch.float32))  # the sample in flight
    done = {}
    while stream.in_flight:
        done |= {d.uid: d for d in stream.step(version=1)}
    results["partial_sample"] = _samples([done[99]])
    head = len(done[99].response_ids) - done[99].versions[-1][1]
    fresh = SamplingParams(do_sample=False, max_new_tokens=10 - head)
    results["partial_sample_hf_tail"] = _rows(
        hf.generate(GenerationRequest([prompts[1] + done[99].response_ids[:head]], fresh))
    )
    _push(rollout, model)
    results["hf_greedy_updated"] = _rows(hf.generate(GenerationRequest(prompts, greedy)))
    results["vllm_greedy_updated"] = _rows(rollout.generate(GenerationRequest(prompts, greedy)))

    # A stream that leaves one parameter out: refused at the end of the session.
    partial = ((n, t) for n, t in full_tensors(model) if n != "model.layers.1.mlp.down_proj.weight")
    try:
        rollout.sync_weights(partial)
    except Exception as error:
        results["partial_sync_error"] = [type(error).__name__, str(error)]


def _lora_scenario(cfg, settings, model, hf, prompts, greedy, results) -> None:
    """A sample streamed under adapter 1 for three tokens, then across a swap to
    adapter 2 (as the fully asynchronous mode's weight sync makes one) to its end; the
    log-probs of its tokens under the base model and under each adapter (peft, the
    training side's model), for the test to say which one made each token."""
    import torch
    from peft import (
        LoraConfig,
        get_peft_model,
        get_peft_model_state_dict,
        set_peft_model_state_dict,
    )

    from engine.errors import EngineError
    from engine.rollout.stream import StreamItem
    from engine.rollout.vllm import VLLMRollout
    from engine.rollout.weights import full_tensors
    from engine.types import GenerationRequest

    try:
        rollout = VLLMRollout(cfg, settings, lora_rank=8)
    except EngineError as error:  # a vLLM too old to serve the adapter says so at start
        results["lora_refused"] = str(error)
        return
    rollout.sync_weights(full_tensors(model, dtype=torch.float32))  # the base, once
    rollout.wake()
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")
    adapted = get_peft_model(model, lora)

    def new_adapter(version):
        with torch.no_grad():  # B starts at zero: a random one moves the policy
            for name, param in adapted.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn_like(param) * 0.5)
        state = {k: v.clone() for k, v in get_peft_model_state_dict(adapted).items()}
        rollout.set_adapter(version, adapted.peft_config["default"], state.items())
        return state

    adapters = [new_adapter(1)]
    stream = rollout.sample_stream()
    stream.add([StreamItem(7, prompts[1])], greedy)
    for _ in range(3):
        assert stream.step(version=1) == []
    adapters.append(new_adapter(2))  # the sample in flight
    done = {}
    while stream.in_flight:
        done |= {d.uid: d for d in stream.step(version=2)}
    results["lora_sample"] = _samples([done[7]])
    results["lora_generate"] = _rows(rollout.generate(GenerationRequest(prompts, greedy)))
    response = done[7].response_ids
    with adapted.disable_adapter():
        results["lora_base_logprobs"] = _training_logprobs(adapted, [prompts[1]], [response])
    for i, state in enumerate(adapters, 1):
        set_peft_model_state_dict(adapted, state)
        results[f"lora_adapter{i}_logprobs"] = _training_logprobs(adapted, [prompts[1]], [response])
    results["lora_adapter2_generate_logprobs"] = _training_logprobs(
        adapted, prompts, results["lora_generate"]["response_ids"]
    )
    rollout.close()


def _write(path: str, results: dict) -> None:
    with open(path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
