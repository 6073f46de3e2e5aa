"""Stop strings (``sampling.stop_strings``): a response ends at the token that completes
its first stop string; what follows becomes padding that reward and loss never see."""

import jax
import numpy as np
import pytest

from rl_batch.rollout import groups as rollout_lib
from rl_batch.rollout.sampler import SampleOutput, SamplingConfig
from rl_batch.runs import config as config_lib
from rl_batch.tasks.base import Score
from rl_batch.tokenizers import CharTokenizer
from tests.run_fixtures import tiny_run_config

TOK = CharTokenizer()


def samples_of(texts: list[str], width: int = 10) -> SampleOutput:
    """Responses ``text + EOS`` right-padded to ``width`` tokens, log-prob -0.5 each."""
    n = len(texts)
    tokens = np.full((n, width), TOK.pad_id, np.int32)
    mask = np.zeros((n, width), bool)
    for i, text in enumerate(texts):
        ids = TOK.encode(text) + [TOK.eos_id]
        tokens[i, : len(ids)], mask[i, : len(ids)] = ids, True
    return SampleOutput(
        prompt_tokens=np.zeros((n, 1), np.int32),
        prompt_mask=np.ones((n, 1), bool),
        response_tokens=tokens,
        response_mask=mask,
        response_logprobs=np.where(mask, -0.5, 0.0).astype(np.float32),
        lengths=mask.sum(1).astype(np.int32),
    )


def test_truncation_by_hand():
    out = rollout_lib.truncate_at_stop_strings(
        TOK, samples_of(["12;34", "5678", "9::0"]), (";", "::")
    )
    # "12;" is 3 tokens: the stop string stays as the last; "34" and the EOS become padding.
    assert out.lengths.tolist() == [3, 5, 3]
    assert out.response_tokens[0].tolist() == TOK.encode("12;") + [TOK.pad_id] * 7
    assert out.response_mask[0].tolist() == [True] * 3 + [False] * 7
    assert out.response_logprobs[0].tolist() == [-0.5] * 3 + [0.0] * 7
    # No stop string: untouched, EOS included.
    assert out.response_tokens[1].tolist()[:5] == TOK.encode("5678") + [TOK.eos_id]
    # "::" is completed by the second ":" (token 3), not the first.
    assert out.response_tokens[2].tolist()[:3] == TOK.encode("9::")
    assert rollout_lib.decode_responses(TOK, out) == ["12;", "5678", "9::"]


def test_no_stop_strings_is_the_identity():
    s = samples_of(["12;34"])
    assert rollout_lib.truncate_at_stop_strings(TOK, s, ()) is s


class _FixedSampler:
    """Returns the same responses for any prompts (a stand-in for the jitted sampler)."""

    max_prompt_len, max_new_tokens = 4, 10

    def __init__(self, texts):
        self.texts = texts

    def __call__(self, params, prompts, *, rng, sampling, max_new_tokens=None):
        return samples_of(self.texts[: len(prompts)])


class _EndsWithSemicolon:
    def score(self, example, response):
        return Score(reward=float(response.endswith(";")), format_ok=True, parsed=response)


def test_rollout_scores_the_truncated_text():
    examples = [{"prompt": "1+1=", "answer": "2"}]
    sampler = _FixedSampler(["12;34", "5678"])
    common = dict(rng=jax.random.key(0), sampling=SamplingConfig(), gen_batch=0)
    args = (sampler, None, _EndsWithSemicolon(), TOK, examples, 2)
    plain = rollout_lib.rollout(*args, **common)
    cut = rollout_lib.rollout(*args, **common, stop_strings=(";",))
    assert plain.rewards_pg.tolist() == [[0.0, 0.0]]
    assert cut.rewards_pg.tolist() == [[1.0, 0.0]]
    assert cut.gen_tokens == 3 + 5 and plain.gen_tokens == 6 + 5


@pytest.mark.parametrize(
    "value, message",
    [((";", 3), "must be a tuple of non-empty strings"), (("",), "must be a tuple")],
)
def test_bad_stop_strings_are_config_errors(tmp_path, value, message):
    c = tiny_run_config(str(tmp_path), run_dir=str(tmp_path / "run"))
    c.sampling.stop_strings = value
    with pytest.raises(ValueError, match=message):
        config_lib.resolve(c)


def test_stop_strings_with_partial_rollout_are_refused(tmp_path):
    c = tiny_run_config(str(tmp_path), run_dir=str(tmp_path / "run"))
    c.sampling.stop_strings = (";",)
    c.partial_rollout.enabled = True
    with pytest.raises(ValueError, match="not supported with partial_rollout"):
        config_lib.resolve(c)


def test_a_config_read_back_from_json_resolves_to_the_same_stop_strings(tmp_path):
    import json

    from ml_collections import ConfigDict

    c = tiny_run_config(str(tmp_path), run_dir=str(tmp_path / "run"))
    c.sampling.stop_strings = (";", "::")
    once = config_lib.resolve(c)
    again = config_lib.resolve(ConfigDict(json.loads(json.dumps(once.to_json()))))
    assert again.inputs.sampling.stop_strings == (";", "::")
    assert again == once
    assert config_lib.load_spec(json.loads(json.dumps(once.to_json()))) == once


def test_a_run_written_before_stop_strings_existed_resumes_without_a_diff(tmp_path):
    c = tiny_run_config(str(tmp_path), run_dir=str(tmp_path / "run"))
    new = config_lib.resolve(c).to_json()
    old = {**new, "sampling": {k: v for k, v in new["sampling"].items() if k != "stop_strings"}}
    assert config_lib.resume_diffs(old, new) == []
    changed = {**new, "sampling": {**new["sampling"], "stop_strings": (";",)}}
    assert config_lib.resume_diffs(old, changed) == ["sampling.stop_strings: [] -> [';']"]
