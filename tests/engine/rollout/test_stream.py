"""Samples as a stream (the fully asynchronous mode's rollout): the HF rollout advanced a
chunk at a time generates what one ``generate`` call does, samples join and leave between
steps, and new weights that arrive mid-sample take over from the next token, each token
tagged with the version that made it. (vLLM's stream: test_vllm_engine.py.)"""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.rollout.hf import HFRollout
from engine.rollout.hf_stream import HFSampleStream
from engine.rollout.stream import StreamItem, add_run, advance, cut_runs
from engine.types import GenerationRequest, SamplingParams

PROMPTS = [[1, 40, 41, 42], [1, 50, 51], [1, 60], [7, 8, 9, 10, 11]]
GREEDY = SamplingParams(do_sample=False, max_new_tokens=10)


def test_version_runs_merge_and_cut():
    runs: list[tuple[int, int]] = []
    add_run(runs, 0, 3)
    add_run(runs, 0, 2)
    add_run(runs, 1, 0)  # nothing made: no run
    add_run(runs, 2, 4)
    assert runs == [(0, 5), (2, 4)]
    assert cut_runs(runs, 7) == [(0, 5), (2, 2)]
    assert cut_runs(runs, 5) == [(0, 5)]
    assert cut_runs(runs, 2) == [(0, 2)]


@pytest.fixture()
def rollout(tiny_model_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # the random tiny model repeats one token greedily: vary it
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    hf = HFRollout(model, AutoTokenizer.from_pretrained(tiny_model_dir), torch.device("cpu"),
                   logprobs=True)  # fmt: skip
    # an end token greedy decoding of the first prompt reaches at its 4th token
    probe = hf.generate(GenerationRequest(PROMPTS, GREEDY)).response_ids[0]
    hf.eos_token_ids = set(hf.eos_token_ids) | {probe[3]}
    return hf


def _drain(stream, version):
    done = {}
    while stream.in_flight:
        for sample in stream.step(version):
            done[sample.uid] = sample
    return done


def test_a_chunked_stream_generates_what_generate_does(rollout):
    want = rollout.generate(GenerationRequest(PROMPTS, GREEDY))
    stream = HFSampleStream(rollout, chunk_tokens=3)
    stream.add([StreamItem(i, p) for i, p in enumerate(PROMPTS[:2])], GREEDY)
    first = advance(stream, [], GREEDY, version=0, steps=1)
    assert first == [] and stream.in_flight == 2  # 3 tokens each: none finished yet
    # the others join the running stream
    stream.add([StreamItem(i, p) for i, p in enumerate(PROMPTS) if i >= 2], GREEDY)
    done = _drain(stream, version=0)
    assert [done[i].response_ids for i in range(4)] == want.response_ids
    assert [done[i].finished for i in range(4)] == want.finished == [True, False, False, False]
    assert [done[i].versions for i in range(4)] == [[(0, 4)], [(0, 10)], [(0, 10)], [(0, 10)]]
    for i in range(4):
        assert done[i].logprobs == pytest.approx(want.logprobs[i], abs=1e-4)


def test_new_weights_mid_sample_make_its_next_tokens(rollout):
    """A partial rollout: three tokens under version 0, new weights, the rest under
    version 1 — exactly what the new weights generate from the sample so far."""
    stream = HFSampleStream(rollout, chunk_tokens=3)
    stream.add([StreamItem(7, PROMPTS[1])], GREEDY)
    assert stream.step(version=0) == []
    with torch.no_grad():
        for param in rollout.module.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    (sample,) = _drain(stream, version=1).values()
    assert sample.versions == [(0, 3), (1, 7)]
    head = sample.response_ids[:3]
    fresh = SamplingParams(do_sample=False, max_new_tokens=7)
    tail = rollout.generate(GenerationRequest([PROMPTS[1] + head], fresh)).response_ids[0]
    assert sample.response_ids == head + tail
    assert (sample.first_version, sample.last_version) == (0, 1)


def test_dropped_samples_are_gone(rollout):
    stream = HFSampleStream(rollout, chunk_tokens=2)
    stream.add([StreamItem(0, PROMPTS[2])], GREEDY)
    stream.step(version=0)
    stream.drop()
    assert stream.in_flight == 0 and stream.step(version=0) == []
