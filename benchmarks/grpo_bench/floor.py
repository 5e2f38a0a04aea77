"""The floor: one process, one Hugging Face ``generate`` of the step's completions and
one forward/backward/AdamW step on them. No scoring, no Ray, no FSDP: the least any
implementation can spend on a step of this configuration. Runs in a child process."""

from __future__ import annotations

import time
from pathlib import Path

from .config import Setup, StepRecord, load_prompts, write_child_result
from .contention import other_cores, snapshot


def child_floor(setup: Setup, out: Path) -> None:
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(setup.threads)
    torch.manual_seed(setup.seed)
    tokenizer = AutoTokenizer.from_pretrained(setup.model_dir)
    model = AutoModelForCausalLM.from_pretrained(setup.model_dir, dtype=torch.float32)
    if setup.gradient_checkpointing:  # the same configuration as the other systems
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers 5
        (enable or model.gradient_checkpointing_enable)({"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr, weight_decay=setup.weight_decay)
    eos = model.generation_config.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    rows = load_prompts(setup)
    records: list[StepRecord] = []
    for step in range(setup.total_steps):
        chats = [r["prompt"] for r in rows[step * setup.prompts : (step + 1) * setup.prompts]]
        begin = snapshot(time.process_time())
        # Tokenised as the engine's dataset does it: template as text, then no specials.
        texts = tokenizer.apply_chat_template(chats, tokenize=False, add_generation_prompt=True)
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        prompt_ids = [ids for ids in encoded for _ in range(setup.n)]
        width = max(len(p) for p in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
        prompt_mask = torch.zeros_like(input_ids)
        for i, ids in enumerate(prompt_ids):
            input_ids[i, width - len(ids) :] = torch.tensor(ids)
            prompt_mask[i, width - len(ids) :] = 1
        model.eval()
        with torch.no_grad():
            sequences = model.generate(
                input_ids=input_ids,
                attention_mask=prompt_mask,
                do_sample=True,
                temperature=setup.temperature,
                top_p=1.0,
                top_k=None,
                max_new_tokens=setup.max_new_tokens,
                eos_token_id=eos,
                pad_token_id=pad,
            )
        gen_s = time.perf_counter() - begin.t
        completion = sequences[:, width:]
        is_eos = completion == eos
        no_eos = torch.full_like(completion[:, 0], completion.shape[1])
        first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), no_eos)
        completion_mask = (torch.arange(completion.shape[1]) <= first_eos[:, None]).long()
        attention = torch.cat([prompt_mask, completion_mask], dim=1)
        # Any advantages do: the floor measures the work, not the learning.
        advantages = torch.randn(len(prompt_ids), 1)
        model.train()
        # The LM head only where a completion token is predicted (as TRL and the engine).
        r_len = completion.shape[1]
        logits = model(
            input_ids=sequences, attention_mask=attention, logits_to_keep=r_len + 1
        ).logits[:, :-1]
        logp = torch.gather(F.log_softmax(logits, -1), 2, completion[..., None]).squeeze(-1)
        mask = completion_mask.float()
        loss = -(advantages * logp * mask).sum() / mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end = snapshot(time.process_time())
        records.append(
            StepRecord(
                seconds=end.t - begin.t,
                tokens=int(attention.sum()),
                stages={"gen": gen_s, "update": end.t - begin.t - gen_s},
                response_length=float(mask.sum(1).mean()),
                wall_s=end.t - begin.t,  # nothing runs between the floor's steps
                other_cores=other_cores(begin, end),
            )
        )
    write_child_result(out, records)
