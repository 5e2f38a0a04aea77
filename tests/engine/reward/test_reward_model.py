"""The discriminative reward model: its scores against transformers' own forward, the
last-token pooling under padding, the per-data-source split with the rule functions,
and the checks that refuse a model that cannot score."""

import json

import pytest
import torch

from engine.config import load_config
from engine.config.reward import sequence_classifier_problems
from engine.errors import ConfigError
from engine.reward.manager import RewardManager
from engine.reward.model import ModelRewards
from engine.reward.types import ScoreRequest
from engine.workers.reward_model import load_reward_model, sequence_scores


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    from engine.models.tiny import build_tiny_reward_model

    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny_rm"), seed=0)


@pytest.fixture(scope="module")
def rm(rm_dir):
    return load_reward_model(str(rm_dir), False, torch.float32)


@pytest.fixture(scope="module")
def texts_ids(rm_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rm_dir)
    texts = ["Tom has 3 apples.", "2+2=4, so the answer is 4 and not 5 or 6", "hi"]
    return tok, [tok(t)["input_ids"] for t in texts]


def test_scores_equal_transformers_forward_one_by_one(rm, texts_ids):
    _, seqs = texts_ids
    ours = sequence_scores(rm, seqs, micro_batch_size=2, device=torch.device("cpu"))
    with torch.no_grad():  # batch of one, no padding: HF pools its last token
        direct = torch.stack([rm(torch.tensor([s])).logits[0, 0] for s in seqs])
    assert ours.shape == (3,)
    torch.testing.assert_close(ours, direct, atol=1e-5, rtol=1e-5)
    assert ours.std() > 1e-3  # distinct texts, distinct scores


def test_pooling_reads_the_last_real_token_even_when_it_is_the_pad_id(rm, texts_ids):
    tok, seqs = texts_ids
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    assert rm.config.pad_token_id == pad
    ending_in_pad = seqs[1] + [pad]  # a response whose last token is the pad id
    ours = sequence_scores(rm, [seqs[2], ending_in_pad], 2, torch.device("cpu"))
    with torch.no_grad():
        out = rm.base_model(torch.tensor([ending_in_pad])).last_hidden_state[0, -1]
        by_hand = rm.score(out)[0]
        hf_batched = rm(torch.tensor([ending_in_pad, ending_in_pad])).logits[0, 0]
    torch.testing.assert_close(ours[1], by_hand, atol=1e-5, rtol=1e-5)
    # transformers' pad-id search pools an earlier token: the reason we read the mask
    assert not torch.isclose(ours[1], hf_batched, atol=1e-4)
    # micro-batch size does not change a score
    alone = sequence_scores(rm, [ending_in_pad], 1, torch.device("cpu"))
    torch.testing.assert_close(alone[0], ours[1], atol=1e-5, rtol=1e-5)


def _cfg(rm_dir, *extra):
    return load_config(
        [
            "actor_rollout_ref.model.path=x",
            "data.train_files=x",
            "reward_model.num_workers=1",
            "reward_model.enable=true",
            f"reward_model.model.path={rm_dir}",
            *extra,
        ]
    )


def test_data_sources_split_between_the_model_and_the_rules(rm, rm_dir, texts_ids):
    tok, seqs = texts_ids
    cfg = _cfg(rm_dir, "reward_model.data_sources=[prefs]")
    reward = RewardManager(cfg.reward_model, cfg.custom_reward_function, 8)
    model = ModelRewards(cfg.reward_model, tok, ranks=2)
    requests = [
        ScoreRequest("prefs", "x", None),
        ScoreRequest("synthetic/add", "7", "7"),
        ScoreRequest("prefs", "y", None),
    ]
    sent = []

    def run(batch):
        sent.append(len(batch))
        return sequence_scores(rm, batch, 4, torch.device("cpu"))

    prompts = [seqs[0], seqs[1], seqs[2]]
    with reward:
        results = model.score(requests, prompts, [[5], [6], [7]], [[]] * 3, reward, run)
    assert sent == [2]  # two model rows, even over two ranks
    direct = sequence_scores(rm, [seqs[0] + [5], seqs[2] + [7]], 4, torch.device("cpu"))
    assert [results[0].score, results[2].score] == pytest.approx(direct.tolist(), abs=1e-6)
    assert results[0].extras["rm_score"] == results[0].score and results[0].acc == 0.0
    assert results[1].score == 1.0 and "rm_score" not in results[1].extras  # its rule


def test_input_tokenizer_retemplates_the_chat(rm_dir, texts_ids):
    tok, _ = texts_ids
    cfg = _cfg(rm_dir, f"reward_model.model.input_tokenizer={rm_dir}")
    model = ModelRewards(cfg.reward_model, tok, ranks=1)
    chat = [{"role": "user", "content": "2+2?"}]
    response = tok("4")["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    (seq,) = model.sequences([[1, 2]], [response], [chat])
    text = tok.apply_chat_template([*chat, {"role": "assistant", "content": "4"}], tokenize=False)
    assert text.endswith("<|im_start|>assistant\n4<|im_end|>\n")
    assert seq == tok(text)["input_ids"] and seq[:2] != [1, 2]


def test_a_causal_lm_is_refused_naming_the_key(tiny_model_dir):
    from engine.config import validate

    problems = sequence_classifier_problems(str(tiny_model_dir))
    assert len(problems) == 1
    assert "reward_model.model.path" in problems[0] and "ForCausalLM" in problems[0]
    assert "ForSequenceClassification" in problems[0]
    with pytest.raises(ConfigError, match=r"reward_model\.model\.path"):
        validate(_cfg(tiny_model_dir))


def test_bad_reward_model_settings_are_refused_before_start(rm_dir, tmp_path):
    from engine.config import validate

    with pytest.raises(ConfigError, match=r"reward_model\.model\.path is empty"):
        validate(_cfg(""))
    with pytest.raises(ConfigError, match="does not exist"):
        validate(_cfg(tmp_path / "nowhere"))
    two = tmp_path / "two_labels"
    two.mkdir()
    config = json.loads((rm_dir / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b"}
    (two / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="2 labels"):
        validate(_cfg(two))
    validate(_cfg(rm_dir))  # the good one passes


def test_own_pool_needs_its_size_and_a_reward_model(rm_dir):
    from engine.config import validate

    with pytest.raises(ConfigError) as info:
        validate(_cfg(rm_dir, "reward_model.enable_resource_pool=true"))
    problems = "\n".join(info.value.problems)
    assert "reward_model.nnodes must be >= 1" in problems
    assert "reward_model.n_gpus_per_node must be >= 1" in problems
    assert "enable_resource_pool=false" in problems  # the fix
    with pytest.raises(ConfigError, match=r"reward_model\.enable_resource_pool=true without"):
        validate(
            _cfg(
                rm_dir,
                "reward_model.enable=false",
                "reward_model.enable_resource_pool=true",
                "reward_model.nnodes=1",
                "reward_model.n_gpus_per_node=1",
            )
        )


@pytest.mark.parametrize("style", ["discriminative", "generative"])
def test_rows_go_over_the_reward_models_own_ranks(rm_dir, style, monkeypatch):
    from engine.config import validate
    from engine.reward import model as model_module
    from engine.workers.judge import judge_rows_per_rank

    own = ["reward_model.enable_resource_pool=true", "reward_model.nnodes=1"]
    cfg = _cfg(rm_dir, "trainer.n_gpus_per_node=4", *own, "reward_model.n_gpus_per_node=2")
    validate(cfg)
    assert (cfg.world_size, cfg.rm_world_size, cfg.rm_devices_per_node) == (4, 2, 2)
    assert _cfg(rm_dir, "trainer.n_gpus_per_node=4").rm_world_size == 4  # colocated
    if style == "generative":  # the judge's tokenizer is not needed to count its ranks
        monkeypatch.setattr("engine.reward.judge.load_judge_tokenizer", lambda cfg: None)
        monkeypatch.setattr("engine.reward.judge.JudgePrompts", lambda *a: None)
        cfg.reward_model.style = "generative"
        cfg.data.train_batch_size, cfg.data.val_batch_size = 8, None
        cfg.actor_rollout_ref.rollout.n = 5
        # 8 × 5 samples a step over the judge's 2 ranks, not the 4 training ranks
        assert judge_rows_per_rank(cfg) == 8 * 5 // 2
    assert model_module.model_rewards(cfg, tokenizer=None).ranks == 2
