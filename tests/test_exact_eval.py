"""Exact validation: p(reference response) against a per-example full forward pass."""

import jax
import numpy as np
import pytest
from run_fixtures import LEARNER_MODEL, numpy_params

from rl_batch.algorithms import exact_eval
from rl_batch.models import transformer as model_lib
from rl_batch.tasks import synthetic
from rl_batch.tokenizers import CharTokenizer, encode_prompt


def _examples(n):
    task = synthetic.AdditionTask(n_digits=2, scratchpad=True)
    rng = np.random.default_rng(0)
    return [task.make_example(rng).to_dict() for _ in range(n)]


def _direct_logp(config, params, tokenizer, ex, temperature):
    """log p(answer + EOS | prompt): one unpadded sequence, softmax written out here."""
    prompt = encode_prompt(tokenizer, ex["prompt"])
    answer = tokenizer.encode(ex["answer"]) + [tokenizer.eos_id]
    tokens = np.array([prompt + answer], np.int32)
    logits = np.asarray(model_lib.forward(config, params, tokens), np.float64)[0] / temperature
    logp = 0.0
    for j, tok in enumerate(answer):
        row = logits[len(prompt) - 1 + j]
        logp += row[tok] - (row.max() + np.log(np.exp(row - row.max()).sum()))
    return logp


@pytest.mark.parametrize("temperature, chunk", [(1.0, 0), (0.7, 3)])
def test_p_ref_matches_a_direct_forward(temperature, chunk):
    tokenizer = CharTokenizer()
    config = model_lib.get_preset("tiny-1m", **{
        f: getattr(LEARNER_MODEL, f) for f in ("num_layers", "hidden_size", "num_heads",
                                               "num_kv_heads", "head_dim", "intermediate_size")
    }, vocab_size=tokenizer.vocab_size)  # fmt: skip
    params = jax.tree.map(np.asarray, numpy_params(config, seed=1))
    # Prompts of different lengths: left padding must not change anything.
    examples = _examples(4) + [{"prompt": "7+5=", "answer": "2+7+0=0,>21"}]
    scorer = exact_eval.ReferenceScorer(
        config, tokenizer, examples, temperature=temperature, chunk=chunk
    )
    got = scorer(params)
    want = np.array([_direct_logp(config, params, tokenizer, ex, temperature) for ex in examples])
    assert got["eval_ref_logp"] == pytest.approx(want.mean(), rel=1e-4)
    assert got["eval_p_ref"] == pytest.approx(np.exp(want).mean(), rel=1e-4)
    assert 0 < got["eval_p_ref"] < 1


def test_examples_without_a_reference_are_refused():
    with pytest.raises(ValueError, match="example 1 has answer=''"):
        exact_eval.reference_batch(CharTokenizer(), [{"prompt": "1+1=", "answer": "2"},
                                                     {"prompt": "1+2=", "answer": ""}])  # fmt: skip


def test_the_run_scorer_calls_the_configured_rows_at_a_time():
    """``eval_ref_chunk`` reaches the run's scorer: 5 prompts at 2 rows a call are 3 calls
    (the last padded), and p_ref agrees with one call of all 5 to float rounding."""
    from experiments.configs import base
    from rl_batch.runs import config as config_lib
    from rl_batch.runs import run as run_lib

    c = base.run_config()
    c.run_dir, c.eval_metric, c.eval_ref_prompts, c.eval_ref_chunk = "/tmp/r", "p_ref", 5, 2
    c.init.source = "scratch"  # (any params: not the task's warm start, 210 s in the suite)
    spec = config_lib.resolve(c, 1)
    tokenizer = config_lib.make_tokenizer(c)
    task = config_lib.make_task(c)
    rng = np.random.default_rng(0)
    examples = [task.make_example(rng).to_dict() for _ in range(6)]
    scorer = run_lib.make_scorer(spec, tokenizer, examples)
    assert (scorer.chunk, scorer.n, scorer.batch.prompt_tokens.shape[0]) == (2, 5, 6)
    params = run_lib.initial_params(spec)
    whole = exact_eval.ReferenceScorer(spec.model, tokenizer, examples[:5], chunk=0)
    assert scorer(params)["eval_p_ref"] == pytest.approx(whole(params)["eval_p_ref"], rel=1e-5)
