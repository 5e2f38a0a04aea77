"""The teacher role (on-policy distillation): scores the student's samples with a frozen
teacher model, on the teachers' own pool or beside the actor (``distillation.nnodes``).

The pool's ranks are split among the teachers in the order they are configured, each
taking ``num_replicas`` × its tensor-parallel size consecutive ranks
(``teacher_ranks``); a rank builds only its own teacher. The controller sends each rank
the samples of its teacher (engine.loop.distill). Two engines: ``hf``, the Hugging Face model
whole on each device, one forward over each sample; ``vllm``, a vLLM engine per
tensor-parallel group that prefills each sample and returns its prompt log-probs. Either
way the teacher sees the prompt and the response as one sequence, as the student does,
and scores every response token at temperature 1 (its own distribution).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.config.distillation import Teacher
from engine.controller.dispatch import take
from engine.device import DeviceSpec
from engine.errors import EngineError
from engine.train.forward import micro_batches, response_topk
from engine.types import TeacherScores, TokenBatch


def teacher_ranks(cfg: EngineConfig, world: int) -> list[tuple[Teacher, range]]:
    """Each teacher with the ranks of the pool it runs on, in order."""
    d = cfg.distillation
    teachers = d.teachers(cfg.actor_rollout_ref.rollout.name, world)
    out, start = [], 0
    for t in teachers:
        out.append((t, range(start, start + t.world_size)))
        start += t.world_size
    return out


def empty_scores(rows: int, r_len: int, k: int) -> TeacherScores:
    zeros = torch.zeros((rows, r_len))
    if k < 1:
        return TeacherScores(zeros)
    return TeacherScores(
        zeros,
        torch.zeros((rows, r_len, k)),
        torch.zeros((rows, r_len, k), dtype=torch.long),
    )


class TeacherWorker:
    def __init__(
        self, cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
    ) -> None:
        self.k = cfg.distillation.topk
        self.device = device
        self.colocated = cfg.distillation.nnodes == 0
        self.micro_batch_size = cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu or 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        world = dist.get_world_size() if dist.is_initialized() else 1
        mine = [t for t, ranks in teacher_ranks(cfg, world) if rank in ranks]
        if not mine:
            raise EngineError(
                f"teacher rank {rank} of {world} has no teacher (config check missed)"
            )
        self.teacher = mine[0]
        _check_vocabulary(cfg, self.teacher)
        if self.teacher.engine == "vllm":
            self.engine: Any = _vllm_teacher(cfg, self.teacher, device, tokenizer)
            self.model = None
        else:
            self.engine = None
            self.model = _hf_teacher(cfg, self.teacher, device)

    def score(self, tokens: TokenBatch) -> TeacherScores:
        """The teacher's scores of this rank's share of the samples."""
        rows, r_len = tokens.responses_BR.shape
        if self.engine is not None:
            return self._score_vllm(tokens)
        if rows == 0:
            return empty_scores(0, r_len, self.k)
        parts = [
            response_topk(self.model, take(tokens, sl), self.device.torch_device(), self.k)
            for sl in micro_batches(rows, self.micro_batch_size)
        ]
        logp = torch.cat([p[0] for p in parts]).float().cpu()
        if self.k < 1:
            return TeacherScores(logp)
        return TeacherScores(
            logp,
            torch.cat([p[1] for p in parts]).float().cpu(),
            torch.cat([p[2] for p in parts]).cpu(),
        )

    def _score_vllm(self, tokens: TokenBatch) -> TeacherScores:
        rows, r_len = tokens.responses_BR.shape
        attention = tokens.attention_mask_BS.bool()
        sequences = [tokens.input_ids_BS[i][attention[i]].tolist() for i in range(rows)]
        starts = [int(attention[i, :-r_len].sum()) for i in range(rows)]
        if self.colocated:
            self.engine.wake()
        try:
            scored = self.engine.prompt_logprobs(sequences, starts, self.k)
        finally:
            if self.colocated:
                self.engine.sleep()
        out = empty_scores(rows, r_len, self.k)
        for i, (sampled, best) in enumerate(scored):
            out.logprobs_BR[i, : len(sampled)] = torch.tensor(sampled)
            for j, pairs in enumerate(best):
                out.topk_ids_BRK[i, j, : len(pairs)] = torch.tensor([t for t, _ in pairs])
                out.topk_logprobs_BRK[i, j, : len(pairs)] = torch.tensor([lp for _, lp in pairs])
        return out

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()


def _check_vocabulary(cfg: EngineConfig, teacher: Teacher) -> None:
    """Teacher and student must share a vocabulary: the teacher scores the student's ids."""
    from transformers import AutoConfig

    model = cfg.actor_rollout_ref.model
    student = AutoConfig.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
    theirs = AutoConfig.from_pretrained(
        teacher.model_path, trust_remote_code=model.trust_remote_code
    )
    sv = getattr(student.get_text_config(), "vocab_size", None)
    tv = getattr(theirs.get_text_config(), "vocab_size", None)
    if sv != tv:
        raise EngineError(
            f"distillation.teacher_models.{teacher.name}.model_path {teacher.model_path!r} has a"
            f" vocabulary of {tv} tokens where the student ({model.path}) has {sv}: the"
            " teacher scores the student's token ids, so they must share a tokenizer"
        )


def _hf_teacher(cfg: EngineConfig, teacher: Teacher, device: DeviceSpec) -> Any:
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device.supports_bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(
        teacher.model_path,
        dtype=dtype,
        trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code,
    )
    model.requires_grad_(False)
    return model.eval().to(device.torch_device())


# verl's inference keys of a teacher that are fields of the rollout config here
_INFERENCE_FIELDS = (
    "gpu_memory_utilization",
    "enforce_eager",
    "free_cache_engine",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "cudagraph_capture_sizes",
)


def _vllm_teacher(cfg: EngineConfig, teacher: Teacher, device: DeviceSpec, tokenizer: Any) -> Any:
    """A vLLM engine over the teacher's tensor-parallel group, its own weights read once."""
    from transformers import AutoConfig

    from engine.rollout.translate import EngineSettings, kv_cache_bytes_for
    from engine.rollout.vllm import VLLMRollout

    rollout = cfg.actor_rollout_ref.rollout
    inference = teacher.inference
    d = cfg.distillation
    # the whole sample and the one token vLLM generates after it
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length + 1
    max_model_len = int(inference.get("max_model_len") or longest)
    dtype = str(inference.get("dtype") or rollout.dtype) if device.supports_bf16 else "float32"
    engine_kwargs = dict(inference.get("engine_kwargs") or {})
    vllm_kwargs = dict(engine_kwargs.get("vllm") or {})
    # vLLM refuses more log-probs than max_logprobs (20 by default)
    vllm_kwargs["max_logprobs"] = max(int(vllm_kwargs.get("max_logprobs") or 20), d.topk)
    engine_kwargs["vllm"] = vllm_kwargs
    known = {f.name for f in dataclasses.fields(rollout)}
    own = {k: inference[k] for k in _INFERENCE_FIELDS if k in known and k in inference}
    teacher_rollout = dataclasses.replace(
        rollout,
        **own,
        name="vllm",
        tensor_model_parallel_size=teacher.tp,
        engine_kwargs=engine_kwargs,
        max_model_len=max_model_len,
        calculate_log_probs=False,
        lora_as_adapter=False,
    )
    rows = cfg.data.train_batch_size * rollout.n  # at most every sample on one rank
    hf_config = AutoConfig.from_pretrained(teacher.model_path)
    settings = EngineSettings(
        model_path=teacher.model_path,
        eos_token_ids=frozenset({tokenizer.eos_token_id or 0}),  # nothing is generated
        max_model_len=max_model_len,
        seed=cfg.trainer.seed,
        trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code,
        load_format=str(inference.get("load_format") or "auto"),
        local_world_size=d.n_gpus_per_node if d.nnodes > 0 else cfg.trainer.n_gpus_per_node,
        dtype=dtype,
        kv_cache_bytes=(
            kv_cache_bytes_for(hf_config, dtype, max_model_len, rows)
            if device.type == "cpu"
            else None
        ),
    )
    engine = VLLMRollout(teacher_rollout, settings)
    if d.nnodes > 0:
        engine.wake()  # on a pool of its own: awake for the whole run
    return engine
