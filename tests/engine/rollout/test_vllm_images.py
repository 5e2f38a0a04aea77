"""vLLM's multimodal input (engine.rollout.vllm_images, VLLMRollout.generate), checked
without loading a vision-language model into vLLM (its CPU build cannot here:
docs/vision.md): each prompt goes as the chat template rendered it, one pad token per
image, with its images as ``multi_modal_data``; vLLM's expanded prompt must be the
engine's, token for token; pad tokens are never sampled."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import AutoConfig

from engine.data.images import with_image_parts
from engine.errors import EngineError
from engine.rollout.vllm_images import (
    NEVER,
    VisionTokens,
    check_expanded,
    collapse_image_pads,
    vision_tokens,
    vllm_prompt,
)
from engine.types import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def tokens(tiny_vl_model_dir):
    return VisionTokens.of_config(AutoConfig.from_pretrained(tiny_vl_model_dir))


def test_the_models_tokens(tiny_vl_model_dir, tiny_model_dir, tokens):
    config = AutoConfig.from_pretrained(tiny_vl_model_dir)
    assert tokens == VisionTokens(config.image_token_id, 2, config.video_token_id)
    assert vision_tokens(str(tiny_vl_model_dir)) == tokens
    assert vision_tokens(str(tiny_model_dir)) is None  # a text model
    assert tokens.logit_bias() == {config.image_token_id: NEVER, config.video_token_id: NEVER}


def test_prompt_is_the_chat_template_s_with_its_images(vl_prompts, tokens):
    """Collapsed, each prompt is what the chat template renders before any processor
    expands it (what vLLM's processor expects), and its images go beside it."""
    tokenizer, samples = vl_prompts
    for sample in samples:
        prompt = vllm_prompt(sample.prompt_ids, sample.images, tokens)
        if sample.images is None:
            assert prompt == {"prompt_token_ids": sample.prompt_ids}
            continue
        images = list(sample.images.sources)
        chat = with_image_parts(sample.messages, len(images), "test")
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        rendered = tokenizer.encode(text, add_special_tokens=False)
        assert prompt["prompt_token_ids"] == rendered
        assert prompt["prompt_token_ids"].count(tokens.image_token_id) == len(images)
        assert prompt["multi_modal_data"] == {"image": images}
        assert [im.size for im in images] == [im.size for im in sample.images.sources]


def test_two_images_collapse_by_their_own_grids(vl_prompts, tokens):
    _, samples = vl_prompts
    two = samples[2].images  # grids (1, 2, 2) and (1, 4, 6): 1 and 6 pad tokens
    assert two.image_grid_thw_N3.tolist() == [[1, 2, 2], [1, 4, 6]]
    ids = samples[2].prompt_ids
    collapsed = collapse_image_pads(ids, two, tokens)
    assert len(ids) - len(collapsed) == (1 - 1) + (6 - 1)
    second = ids.index(tokens.image_token_id, ids.index(tokens.image_token_id) + 1)
    with pytest.raises(EngineError, match="image 1 needs 6 consecutive pad tokens"):
        collapse_image_pads(ids[:second] + ids[second + 1 :], two, tokens)  # one pad short


def test_an_expansion_other_than_the_engine_s_stops_the_run():
    check_expanded(0, [1, 2, 2, 3], [1, 2, 2, 3])
    check_expanded(0, [1, 2, 2, 3], None)  # nothing reported: nothing to compare
    with pytest.raises(EngineError, match="row 3: vLLM expanded the prompt's images into 5"):
        check_expanded(3, [1, 2, 2, 3], [1, 2, 2, 2, 3])


class FakeLLM:
    """vLLM's LLM.generate as far as the rollout reads it; ``expand`` pads per image."""

    def __init__(self, expand: list[list[int]]):
        self.expand = expand
        self.calls: list = []

    def generate(self, prompts, params, use_tqdm, lora_request):
        self.calls.append((prompts, params))
        completion = SimpleNamespace(token_ids=[7, 8], logprobs=None)
        return [SimpleNamespace(prompt_token_ids=ids, outputs=[completion]) for ids in self.expand]


def _rollout(llm, vision):
    from engine.config import RolloutConfig
    from engine.rollout.tp import tp_layout
    from engine.rollout.vllm import VLLMRollout

    rollout = object.__new__(VLLMRollout)  # no engine: only the calls are checked
    rollout.llm, rollout.vision, rollout._broken, rollout._lora = llm, vision, None, None
    rollout.cfg, rollout.eos_token_ids = RolloutConfig(), {2}
    rollout.layout, rollout.group = tp_layout(1, None), None
    return rollout


def test_generate_sends_images_and_checks_the_expansion(vl_prompts, tokens):
    _, samples = vl_prompts
    ids = [s.prompt_ids for s in samples]
    request = GenerationRequest(ids, SamplingParams(), images=[s.images for s in samples])
    llm = FakeLLM(expand=ids)
    out = _rollout(llm, tokens).generate(request)
    assert out.response_ids == [[7, 8]] * len(samples)
    ((prompts, params),) = llm.calls
    assert [len(p.get("multi_modal_data", {}).get("image", [])) for p in prompts] == [1, 1, 2, 0]
    assert params.logit_bias == tokens.logit_bias()  # the pads are never sampled
    # vLLM's processor made one pad token fewer for the first image than the engine's
    short = [ids[0][:] for _ in ids[:1]] + ids[1:]
    short[0].remove(tokens.image_token_id)
    with pytest.raises(EngineError, match="row 0: vLLM expanded"):
        _rollout(FakeLLM(expand=short), tokens).generate(request)


def test_text_rows_go_as_before(tokens):
    request = GenerationRequest([[5, 6], [7]], SamplingParams())
    llm = FakeLLM(expand=[[5, 6], [7]])
    _rollout(llm, None).generate(request)
    ((prompts, params),) = llm.calls
    assert prompts == [{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7]}]
    assert not params.logit_bias
