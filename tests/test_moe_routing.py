"""Recorded MoE routing: the sampler's expert choices, the rollout-vs-update routing
disagreement metric, and routing replay in the update."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch.algorithms import forward, grpo, learner
from rl_batch.models import moe, sharding, transformer
from rl_batch.rollout import groups as rollout
from rl_batch.rollout import sampler as sampler_lib
from tests.test_moe import _dense_reference, _weights
from tests.test_moe_learner import MOE_MODEL, _params

PROMPTS = [[5, 17, 9, 3], [7, 8, 9], [10, 11], [1, 2, 3, 4, 5, 6], [6], [12, 13], [3], [2, 9]]
KEY = jax.random.key(0)
K = MOE_MODEL.num_experts_per_tok


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_replayed_choices_equal_a_dense_mix_of_those_experts():
    x_td, router_de, gate_edf, up_edf, down_efd = _weights(seed=2)
    forced_tk = jnp.asarray(np.random.RandomState(0).permutation(4)[None, :2].repeat(12, 0))
    forced_tk = forced_tk.at[3].set(-1)  # no record for token 3: its own top-2
    y_td, _ = moe.sparse_moe(
        x_td,
        router_de,
        gate_edf,
        up_edf,
        down_efd,
        top_k=2,
        norm_topk_prob=True,
        experts_tk=forced_tk,
    )
    probs_te = jax.nn.softmax(x_td @ router_de, axis=-1)
    own = jax.lax.top_k(probs_te, 2)[1]
    idx_tk = jnp.where(jnp.arange(12)[:, None] == 3, own, forced_tk)
    w_tk = jnp.take_along_axis(probs_te, idx_tk, axis=-1)
    w_tk = w_tk / w_tk.sum(-1, keepdims=True)
    mix_te = jnp.zeros((12, 4)).at[jnp.arange(12)[:, None], idx_tk].set(w_tk)
    # The dense reference with top_k = E = 4 and unnormalised weights computes every
    # expert; recombine with our mix instead.
    h = jax.nn.silu(jnp.einsum("td,edf->tef", x_td, gate_edf)) * jnp.einsum(
        "td,edf->tef", x_td, up_edf
    )
    want = jnp.einsum("ted,te->td", jnp.einsum("tef,efd->ted", h, down_efd), mix_te)
    np.testing.assert_allclose(y_td, want, atol=2e-5, rtol=1e-5)
    # Without replay the same block differs (the forced experts are not the top-2).
    y_own, _ = moe.sparse_moe(
        x_td, router_de, gate_edf, up_edf, down_efd, top_k=2, norm_topk_prob=True
    )
    np.testing.assert_allclose(
        y_own, _dense_reference(x_td, router_de, gate_edf, up_edf, down_efd, 2, True), atol=2e-5
    )
    assert float(jnp.abs(y_own - y_td).max()) > 1e-2


@functools.cache
def _routing_sampler():
    return sampler_lib.Sampler(
        MOE_MODEL,
        eos_id=MOE_MODEL.vocab_size - 1,
        pad_id=0,
        max_prompt_len=8,
        max_new_tokens=8,
        record_routing=True,
    )


def _samples():
    params = jax.tree.map(jnp.asarray, _params())
    sampling = sampler_lib.SamplingConfig(temperature=1.0)
    return params, _routing_sampler()(params, PROMPTS, rng=KEY, sampling=sampling)


def _batch(out, advantages=None):
    b = out.response_tokens.shape[0]
    if advantages is None:
        advantages = np.linspace(-1, 1, b).astype(np.float32)
    return learner.Batch(
        prompt_tokens=jnp.asarray(out.prompt_tokens),
        prompt_mask=jnp.asarray(out.prompt_mask),
        response_tokens=jnp.asarray(out.response_tokens),
        response_mask=jnp.asarray(out.response_mask),
        advantages=jnp.asarray(advantages),
        old_logprobs=jnp.asarray(out.response_logprobs),
        routed_experts=jnp.asarray(out.routed_experts),
    )


@pytest.mark.slow  # 14 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_sampler_records_the_routing_of_every_fed_token():
    params, out = _samples()
    b, p = out.prompt_tokens.shape
    r = out.response_tokens.shape[1]
    routed = np.asarray(out.routed_experts)
    assert routed.shape == (b, p + r, MOE_MODEL.num_moe_layers, K)
    # Teacher-forced full forward over the same tokens routes every token identically.
    batch = _batch(out)
    _, router_lte, mask_t = forward.response_outputs(MOE_MODEL, params, batch, with_router=True)
    own = np.asarray(moe.top_experts(router_lte, K, b))
    fed = np.concatenate([out.prompt_mask, out.response_mask], axis=1)
    lengths = out.response_mask.sum(1)
    fed[np.arange(b), p + lengths - 1] = False  # the last token is sampled, never fed
    np.testing.assert_array_equal(np.sort(routed, -1)[fed], np.sort(own, -1)[fed])
    assert (routed[~fed] == -1).all()
    assert fed.sum() > 40


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_continuous_engine_records_the_static_engines_routing():
    # 8 rows through 3 slots, refilled as rows end: each row's record (prompt slots from
    # the prefill, response slots from whichever slot decoded it) is the static
    # engine's, -1 where no token was fed.
    params, ref = _samples()
    sampler = _routing_sampler()
    cont = sampler_lib.SamplingConfig(temperature=1.0, engine="continuous", slots=3)
    out = sampler(params, PROMPTS, rng=KEY, sampling=cont)
    np.testing.assert_array_equal(out.response_tokens, ref.response_tokens)
    # Log-probs within the engines' stated fp32 bound (docs/rollout_engine.md), not bit for
    # bit: on one 2-core AMD EPYC (2026-12-07) 2 of 64 differed by 4.8e-7.
    np.testing.assert_allclose(out.response_logprobs, ref.response_logprobs, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(out.routed_experts, ref.routed_experts)
    assert sampler.last_stats["decode_steps"] > 7  # 3 slots took more steps than 8 rows


@pytest.mark.slow  # 25 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_routing_disagreement_metric_and_replay():
    params, out = _samples()
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    opt = learner.make_optimizer(1e-3)

    def update(batch, **config):
        # A fresh copy each time: the update donates (deletes) its state's buffers.
        fresh = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
        state = learner.init_train_state(MOE_MODEL, fresh, opt, mesh=mesh)
        fn = grpo.make_update_fn(MOE_MODEL, grpo.GRPOConfig(**config), opt, mesh)
        state, metrics = fn(state, batch, KEY)
        return jax.tree.map(np.asarray, state.params), jax.tree.map(float, metrics)

    batch = _batch(out)
    plain_params, plain = update(batch)
    assert plain["moe_routing_disagreement"] == 0.0  # same params, fp32: same routing
    # Replay of identical choices changes nothing.
    replay_params, replayed = update(batch, routing_replay=True)
    np.testing.assert_allclose(replayed["loss"], plain["loss"], rtol=1e-6)
    for a, c in zip(jax.tree.leaves(plain_params), jax.tree.leaves(replay_params)):
        np.testing.assert_allclose(a, c, atol=1e-7)

    # Rewrite the record of 5 real (token, layer) pairs to another expert set.
    routed = np.asarray(out.routed_experts).copy()
    rows, slots, layers = np.nonzero((routed >= 0).all(-1))
    pick = np.random.RandomState(0).choice(len(rows), 5, replace=False)
    for i in pick:
        cur = routed[rows[i], slots[i], layers[i]]
        routed[rows[i], slots[i], layers[i]] = [e for e in range(8) if e not in cur][:K]
    fed = (routed >= 0).all(-1).sum()  # every recorded pair is a real token
    moved = batch.replace(routed_experts=jnp.asarray(routed))
    _, m = update(moved)
    np.testing.assert_allclose(m["moe_routing_disagreement"], 5 / fed, rtol=1e-6)
    np.testing.assert_allclose(m["loss"], plain["loss"], rtol=1e-6)  # no replay: same loss
    # With replay the forward follows the rewritten record: different log-probs and loss.
    _, mr = update(moved, routing_replay=True)
    assert abs(mr["logprob_mean"] - plain["logprob_mean"]) > 1e-6
    want_out, want_router_lte = transformer.forward_with_router(
        MOE_MODEL,
        params,
        jnp.concatenate([moved.prompt_tokens, moved.response_tokens], axis=1),
        input_mask_bt=jnp.concatenate([moved.prompt_mask, moved.response_mask], axis=1),
        replay_experts_btlk=moved.routed_experts,
    )
    p = moved.prompt_tokens.shape[1]
    r = moved.response_tokens.shape[1]
    logp_brv = np.asarray(jax.nn.log_softmax(want_out[:, p - 1 : p + r - 1], -1))
    tokens_br = np.asarray(moved.response_tokens)
    logp = np.take_along_axis(logp_brv, tokens_br[..., None], -1)[..., 0]
    mask = np.asarray(moved.response_mask)
    np.testing.assert_allclose(mr["logprob_mean"], logp[mask].mean(), rtol=1e-5)
    # compute_logprobs(replay=True) (the behaviour log-probs of multi-update batches).
    got = np.asarray(forward.compute_logprobs(MOE_MODEL, params, moved, replay=True))
    np.testing.assert_allclose(got[mask], logp[mask], atol=1e-5)
    # Under replay the disagreement compares the router's own top-k with the record; the
    # rewritten layer-0 choices also change later layers' inputs, so it is >= 5 / fed.
    mask_bt = jnp.concatenate([moved.prompt_mask, moved.response_mask], axis=1)
    sums = moe.routing_disagreement_sums(want_router_lte, moved.routed_experts, mask_bt, K)
    want = float(sums["moe_route_diff"] / sums["moe_route_count"])
    np.testing.assert_allclose(mr["moe_routing_disagreement"], want, rtol=1e-6)
    assert want >= 5 / fed


def test_replay_needs_a_record_and_a_moe_policy():
    params, out = _samples()
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    opt = learner.make_optimizer(1e-3)
    fresh = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
    state = learner.init_train_state(MOE_MODEL, fresh, opt, mesh=mesh)
    fn = grpo.make_update_fn(MOE_MODEL, grpo.GRPOConfig(routing_replay=True), opt, mesh)
    with pytest.raises(ValueError, match="routing replay needs the batch's routed_experts"):
        fn(state, _batch(out).replace(routed_experts=None), KEY)
    with pytest.raises(ValueError, match="record_routing=True needs a MoE model"):
        sampler_lib.Sampler(
            MOE_MODEL.replace(num_experts=0),
            eos_id=1,
            pad_id=0,
            max_prompt_len=4,
            max_new_tokens=4,
            record_routing=True,
        )


def test_concat_outputs_pads_the_routing_record():
    def chunk(p, r, fill):
        return sampler_lib.SampleOutput(
            prompt_tokens=np.ones((1, p), np.int32),
            prompt_mask=np.ones((1, p), bool),
            response_tokens=np.ones((1, r), np.int32),
            response_mask=np.ones((1, r), bool),
            response_logprobs=np.zeros((1, r), np.float32),
            lengths=np.array([r], np.int32),
            routed_experts=np.full((1, p + r, 2, 2), fill, np.int16),
        )

    out = rollout._concat_outputs([chunk(2, 3, 7), chunk(4, 1, 5)])
    assert out.routed_experts.shape == (2, 4 + 3, 2, 2)
    # Row 0: prompt left-padded by 2 (-1), its 2 prompt + 3 response slots, no right pad.
    np.testing.assert_array_equal(out.routed_experts[0, :, 0, 0], [-1, -1, 7, 7, 7, 7, 7])
    # Row 1: 4 prompt slots, 1 response slot, then 2 right-pad slots.
    np.testing.assert_array_equal(out.routed_experts[1, :, 0, 0], [5, 5, 5, 5, 5, -1, -1])
    plain = rollout._concat_outputs([chunk(2, 3, 7).replace(routed_experts=None)])
    assert plain.routed_experts is None


@pytest.mark.slow  # 31 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_run_loop_on_a_moe_policy_with_replay(tmp_path):
    """run.run end to end: MoE metrics in metrics.jsonl, routing recorded and replayed."""
    from rl_batch import artifacts
    from rl_batch.runs import run as run_lib
    from tests.run_fixtures import tiny_run_config

    moe_fields = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"), budget_responses=32)
    c.model.overrides = {**dict(c.model.overrides), **moe_fields}
    c.grpo.routing_replay = True
    c.grpo.router_aux_loss_coef = 0.01
    summary = run_lib.run(c, progress=False)
    assert summary["status"] == "finished"
    updates = artifacts.read_metrics(str(tmp_path / "run"), "update")
    assert len(updates) == 2
    # The continuous engine records the same routing: the replayed run learns the same.
    c.run_dir, c.sampling.engine, c.sampling.slots = str(tmp_path / "cont"), "continuous", 3
    assert run_lib.run(c, progress=False)["status"] == "finished"
    saved = artifacts.read_json(str(tmp_path / "cont" / artifacts.CONFIG_FILE))["sampling"]
    assert (saved["engine"], saved["slots"]) == ("continuous", 3)
    learned = ("loss", "moe_routing_disagreement", "moe_aux_loss", "ratio_mean", "reward_mean")
    for u, v in zip(updates, artifacts.read_metrics(str(tmp_path / "cont"), "update")):
        assert [u[k] for k in learned] == [v[k] for k in learned]
    for u in updates:
        assert u["moe_aux_loss"] > 0 and u["moe_load_max"] >= 1.0
        # Same params in the sampler and the update (fp32): the record is the update's
        # own routing, up to near-ties between the KV-cache and full forwards.
        assert 0.0 <= u["moe_routing_disagreement"] < 0.02
        assert abs(sum(u[f"moe_frac_e{e}"] for e in range(4)) - 1) < 1e-5
