import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.models.tiny import IM_END, build_tiny_model, build_tokenizer, main

TEXT = "Tom has 1,234 apples and $5.67!\n  def f(x): return x**2  # 3 + 4 = 7"


def test_reload_with_auto_classes(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen2"
    assert model.config.tie_word_embeddings
    assert len(tokenizer) == model.config.vocab_size == 2048
    assert tokenizer.eos_token == IM_END
    assert tokenizer.pad_token == "<|endoftext|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert 1_000_000 < sum(p.numel() for p in model.parameters()) < 2_000_000


def test_round_trip_and_ids_survive_reload(tiny_model_dir):
    reloaded = AutoTokenizer.from_pretrained(tiny_model_dir)
    fresh = build_tokenizer()
    ids = reloaded(TEXT).input_ids
    assert ids == fresh(TEXT).input_ids
    assert reloaded.decode(ids) == TEXT
    # Digits are single tokens (Qwen2's split), which arithmetic tasks rely on.
    assert [reloaded.decode([i]) for i in reloaded("1234").input_ids] == ["1", "2", "3", "4"]


def test_chat_template(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": "Add 3 and 4."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nAdd 3 and 4.<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    closed = tokenizer.apply_chat_template(messages, tokenize=False)
    assert not closed.endswith("assistant\n")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert tokenizer.decode(ids) == text


def test_same_seed_same_weights_other_seed_differs(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", seed=3)).state_dict()
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", seed=3)).state_dict()
    c = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "c", seed=4)).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    vocab_a = (tmp_path / "a" / "tokenizer.json").read_text()
    assert vocab_a == (tmp_path / "b" / "tokenizer.json").read_text()


def test_forward_and_generate(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    batch = tokenizer(["Add 3 and 4.", "12 + 30 = 42"], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**batch)
    assert out.logits.shape == (2, batch.input_ids.shape[1], len(tokenizer))
    assert torch.isfinite(out.logits).all()
    generated = model.generate(**batch, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] == batch.input_ids.shape[1] + 4


def test_cli(tmp_path, capsys):
    main([str(tmp_path / "cli"), "--seed", "1"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    assert (tmp_path / "cli" / "model.safetensors").is_file()
    assert (tmp_path / "cli" / "generation_config.json").is_file()


def test_the_chat_template_without_tools_is_plain_chatml():
    """Tools support (engine/agents) left every existing prompt's tokens as they were."""
    tok = build_tokenizer()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    chatml = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    assert tok.apply_chat_template(messages, tokenize=False) == chatml
    opened = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert opened == chatml.rsplit("<|im_start|>assistant", 1)[0] + "<|im_start|>assistant\n"
    with_tools = tok.apply_chat_template(
        messages[:2], tools=[{"type": "function", "function": {"name": "f"}}], tokenize=False
    )
    assert with_tools.startswith("<|im_start|>system\nBe brief.\n\nCall a tool by writing")
    assert '"name": "f"' in with_tools and with_tools.endswith("<|im_start|>user\n2+2?<|im_end|>\n")
