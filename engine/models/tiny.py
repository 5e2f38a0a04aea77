"""Build a tiny model (Qwen2-shaped by default; any of ``engine.models.families``) and
its tokenizer locally, without a model hub.

The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on generated
text (the synthetic task, templated word problems, arithmetic) and a fixed selection of
the Python standard library's own sources. It uses Qwen2's pre-tokenizer split pattern
(digits one by one) because transformers 5 reloads any ``qwen2`` folder as
``Qwen2Tokenizer``, which imposes that pattern: trained with another one, the token ids
would change after a reload. The model is a randomly initialised ``Qwen2ForCausalLM``
(about 1.3M parameters with the defaults), or of another family with the sizes its
record asks for (``ModelFamily.tiny``). Same seed, same weights; the vocabulary does not
depend on the seed.

    python -m engine.models.tiny OUT_DIR [--seed N] [--model-type qwen3]
"""

from __future__ import annotations

import argparse
import itertools
import random
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.models.families import MODEL_TYPES, family
from engine.models.families.base import TinySize

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# ChatML; ``add_generation_prompt`` opens the assistant's turn. With ``tools`` (OpenAI
# function schemas), a system turn lists them and says how to call one (Hermes-style
# ``<tool_call>`` JSON, what engine/agents/tools' hermes parser reads); a ``tool`` message
# comes back as a user turn wrapped in ``<tool_response>``. Without tools or tool
# messages it renders exactly as plain ChatML.
CHAT_TEMPLATE = (
    "{%- set rest = messages %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n\\n' }}{%- set rest = messages[1:] %}"
    "{%- endif %}"
    '{{- \'Call a tool by writing <tool_call>{"name": NAME, "arguments": {...}}</tool_call>;\''
    " + ' the tools:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in rest %}"
    "{%- if message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content']"
    " + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2's pre-tokenizer split (transformers' Qwen2Tokenizer uses the same pattern).
QWEN2_SPLIT_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Standard-library modules read for variety; a fixed list keeps the corpus deterministic.
_STDLIB_FILES = (
    "string.py",
    "textwrap.py",
    "fractions.py",
    "statistics.py",
    "random.py",
    "calendar.py",
    "heapq.py",
    "bisect.py",
    "json/encoder.py",
    "json/decoder.py",
    "argparse.py",
)

_NAMES = ("Tom", "Ana", "Lee", "Mia", "Sam", "Ravi", "Zoe", "Omar", "Lin", "Eva")
_ITEMS = ("apples", "books", "coins", "eggs", "pens", "cards", "shells", "stickers")


def _word_problems(rng: random.Random, n: int) -> list[str]:
    lines = []
    for _ in range(n):
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        a, b = rng.randint(2, 99), rng.randint(1, 50)
        lines.append(
            f"{name} has {a} {item}. {name} buys {b} more. How many {item} does {name} have now?"
        )
        lines.append(f"{name} has {a} + {b} = {a + b} {item}.\n#### {a + b}")
        lines.append(f"The answer is $\\boxed{{{a + b}}}$. Answer: {a + b}")
        lines.append(f"<answer>{a} + {b}</answer>")
    return lines


def _arithmetic(rng: random.Random, n: int) -> list[str]:
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(1, 99)
        op = rng.choice("+-*/")
        value = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / b, 3)}[op]
        lines.append(f"{a} {op} {b} = {value}")
    lines.append(" ".join(str(i) for i in range(1000)))
    return lines


def _stdlib_text() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for name in _STDLIB_FILES:
        path = root / name
        if path.is_file():
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return texts


def training_corpus(extra: Sequence[str] = ()) -> list[str]:
    """The text the BPE is trained on (deterministic), with ``extra`` lines after it."""
    from engine.data import synthetic

    rng = random.Random("engine.models.tiny")
    lines = ["system\nYou are a helpful assistant."]
    # The task's text as the chat template lays it out (role names included).
    for question, answer in synthetic.sample_problems(2000, seed=0):
        lines.append(f"user\n{question}\nassistant\n{answer}")
    lines += _word_problems(rng, 500)
    lines += _arithmetic(rng, 1000)
    lines += _stdlib_text()
    return lines + list(extra)


def build_tokenizer(
    vocab_size: int = 2048,
    *,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    extra_corpus: Sequence[str] = (),
    chat_template: str = CHAT_TEMPLATE,
):
    """A byte-level BPE wrapped as a ``PreTrainedTokenizerFast`` (ChatML template by
    default). A model of its own may add special tokens (ids after the defaults', which
    keep theirs), corpus lines and its template (``engine.models.tiny_vl``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(extra_corpus), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        chat_template=chat_template,
        model_max_length=2048,
    )


def tiny_config(
    model_type: str = "qwen2",
    *,
    vocab_size: int = 2048,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    num_experts: int = 0,
    **fields: Any,
):
    """A tiny ``transformers`` config of a model family (``engine.models.families``):
    these sizes, tied embeddings, float32, then the family's own fields
    (``ModelFamily.tiny``: its experts, ``num_experts`` of them or its default number;
    head sizes...) and ``fields`` last."""
    import transformers

    shape = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        dtype="float32",
    )
    shape.update(family(model_type).tiny(TinySize(hidden_size, num_heads, num_experts)))
    shape.update(fields)
    return transformers.AutoConfig.for_model(model_type, **shape)


def random_model(config: Any, seed: int = 0):
    """A randomly initialised causal LM of ``config``: the same weights for the same seed.
    Routers are drawn with std 0.5 (HF's 0.02 would route almost uniformly, so that
    rounding could flip a token's experts), DeepSeek's routing bias with std 0.05."""
    import torch
    import transformers

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("mlp.gate.weight"):
                    param.normal_(0.0, 0.5)
            for name, buffer in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buffer.normal_(0.0, 0.05)
    return model


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 2048,
    model_type: str = "qwen2",
    **sizes: int,
) -> Path:
    """Save a random model of a family (``tiny_config``, with ``sizes``: hidden_size,
    num_layers, num_heads, num_kv_heads, intermediate_size, num_experts; ``qwen2`` by
    default, with ``num_experts`` ``qwen3_moe``; ``random_model``) and its tokenizer
    under ``out_dir``; return it."""
    from transformers import GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    if sizes.get("num_experts") and model_type == "qwen2":
        model_type = "qwen3_moe"
    ids = dict(bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id)
    config = tiny_config(model_type, vocab_size=len(tokenizer), **sizes, **ids)
    model = random_model(config, seed)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_reward_model(
    out_dir: str | Path, *, seed: int = 0, vocab_size: int = 2048, **sizes: int
) -> Path:
    """Save a random ``Qwen2ForSequenceClassification`` with one label (a reward model
    for ``reward_model.model.path``) and the same tokenizer under ``out_dir``; return it.
    Its score head is drawn with std 1 (HF's 0.02 would give near-equal scores)."""
    import torch
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    pad_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    config = tiny_config(
        "qwen2",
        vocab_size=len(tokenizer),
        num_labels=1,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        **sizes,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForSequenceClassification.from_config(config)
        with torch.no_grad():
            model.score.weight.normal_(0.0, 1.0)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_judge(
    out_dir: str | Path, *, verdict: str = "Score: 7", seed: int = 0, vocab_size: int = 2048
) -> Path:
    """Save a Qwen2 causal LM that answers every chat prompt (its tokenizer's generation
    prompt) with ``verdict`` and then EOS under greedy decoding, and its tokenizer, under
    ``out_dir``; return it. A judge for ``reward_model.style=generative`` whose verdicts
    are known in advance: its layers add nothing (attention and MLP outputs zeroed), so
    the last hidden state is the normed embedding of the last token, and its untied output
    head maps each token of the chain (the prompt's last token, the verdict's tokens) to
    the next."""
    import torch
    from transformers import GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    ids = dict(bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id)
    config = tiny_config("qwen2", vocab_size=len(tokenizer), tie_word_embeddings=False, **ids)
    model = random_model(config, seed)
    asks = tokenizer.apply_chat_template(
        [{"role": "user", "content": "?"}], add_generation_prompt=True, tokenize=False
    )
    start = tokenizer(asks, add_special_tokens=False)["input_ids"][-1]
    chain = [start, *tokenizer(verdict, add_special_tokens=False)["input_ids"], eos_id]
    if len(set(chain)) != len(chain):
        raise ValueError(f"verdict {verdict!r} repeats a token: the chain would loop")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        embeddings, head = model.model.embed_tokens.weight, model.lm_head.weight
        head.zero_()
        for token, following in itertools.pairwise(chain):
            head[following] = 10.0 * embeddings[token] / embeddings[token].norm()
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m engine.models.tiny",
        description="A tiny random model (Qwen2 by default) and a locally trained tokenizer.",
    )
    parser.add_argument("out_dir", help="folder to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-type", choices=MODEL_TYPES, default="qwen2")
    args = parser.parse_args(argv)
    print(build_tiny_model(args.out_dir, seed=args.seed, model_type=args.model_type))


if __name__ == "__main__":
    main()
