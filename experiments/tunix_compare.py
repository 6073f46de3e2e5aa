r"""Our sampler against tunix's on the same weights: greedy tokens and tokens/s (CPU).

  python -m experiments.tunix_compare [--batches=64] [--prompt_len=16] [--new_tokens=128] \
      [--preset=tiny-5m] [--vocab_size=512] [--seed=0] [--min_repeats=3] [--out=tunix.json]

A benchmark, not a test: it needs tunix (``google-tunix``), which the project does not
install. One JAX CPU device (``jax_num_cpu_devices=1``).

What it does, per batch size B (``--batches``, a list):

1. Our model (``rl_batch.models.transformer``) at ``--preset`` with ``--vocab_size``, random
   weights from ``--seed`` (``random_params``: ``init_params`` with the RMSNorm scales
   drawn around 1, so that a swapped norm in the mapping shows), and tunix's Qwen3
   (``tunix.models.qwen3.model.Qwen3``) of the same shape holding the same weights
   (``tunix_weights``: an explicit name and layout mapping). The mapping is checked
   before anything is timed: the full-forward logits of both models on the same random
   tokens must agree to ``PARITY_RTOL`` of the largest logit (max |difference| printed).
2. B prompts of exactly ``--prompt_len`` tokens (so neither sampler pads a prompt) are
   decoded greedily for exactly ``--new_tokens`` tokens by our ``Sampler`` (static engine,
   ``SamplingConfig(greedy=True)``, stop id outside the vocabulary; as
   ``experiments.throughput``'s sampler part builds it) and by tunix's ``Sampler``
   (``tunix.generate.sampler``, greedy: no top_p / beam_size, ``temperature=0``; pad id
   and stop id outside the vocabulary, prompts given as strings of ids through a
   whitespace id tokenizer). Both return the B x R generated tokens; the fraction of rows
   (and of tokens) where they agree is reported. On random weights the logits are
   nearly flat and a near-tie can flip at fp32 rounding; for each row that differs the
   gap between the two candidate tokens' logits at the first differing step (our
   forward on our tokens) is reported, so a flip at a near-tie can be told from a bug.
3. Timing, interleaved in one process: after one untimed warm-up call each (the jit
   compiles), rounds of (ours, tunix) calls until ``--min_repeats`` rounds and
   ``--min_time_s`` seconds; each call is the sampler's whole public call (prompt lists
   in, host tokens out). The median wall time of each is reported with tokens/s
   (B x R / time), the ratio to tunix's tokens/s at the same B, the median 1-minute load
   average read before each timed call and the median process CPU seconds of a call
   (all threads). The rounds, the load record and the table are ``rl_batch.bench``'s
   (``time_interleaved``, ``markdown_table``).

Both sides do the same model work per call except that tunix's decode loop runs one
forward more (R decode forwards after the prefill; the last one's token falls outside
its buffer) than ours (R - 1), a 1/R difference that is part of its sampler's cost.
Both decode steps attend over all P + R cache slots (our ``attn_block`` = 0 default).

Flags: the ones this script shares with ``experiments.throughput`` (imported for
``device_description`` and the sampler it builds) are that module's
flags, with this script's defaults: ``--preset``, ``--vocab_size``, ``--batches`` (here
default 64), ``--prompt_len``, ``--new_tokens`` (here 128), ``--min_repeats`` (here 3),
``--min_time_s``, ``--seed``, ``--out``. Its other flags (``--part``, ``--hf``, ...) are
refused here.

Limits of tunix 0.1.7 that shape the comparison: its Qwen3 attention applies RoPE with
theta 1e6 whatever ``ModelConfig.rope_theta`` says, so our config takes
``rope_theta=1e6`` (Qwen3's own); its decode marks any token equal to the pad id as
padding, so the pad id is outside the vocabulary (a generated token can never be it).

``--out`` writes ``{"device", "rows": [...], "parity", "agreement", "settings",
"software", "git"}`` as JSON (overwritten).

Installed for the measurements (a venv of its own, Python 3.11.7):
``pip install -e . -c requirements/lock.txt``; then ``pip install --no-deps
google-tunix==0.1.7`` (its ``safetensors<0.8`` pin conflicts with the lock's
``safetensors==0.8.0``, which ``transformers==5.24.0`` needs) and its other requirements
under the lock: ``pip install -c requirements/lock.txt datasets fsspec
google-metrax>=0.2.3 grain hf_transfer huggingface_hub importlib_resources jaxtyping
jinja2 kagglehub numba omegaconf pillow pylatexenc python-dotenv perfetto qwix>=0.1.6
sentencepiece sympy tensorflow_datasets tqdm tenacity``. That kept the project's
jax 0.10.2, jaxlib 0.10.2, flax 0.12.8, numpy 2.4.6, orbax-checkpoint 0.12.8 and added
google-tunix 0.1.7, qwix 0.1.8, google-metrax 0.2.4, grain 0.2.18, jaxtyping 0.3.11
(safetensors stays 0.8.0; tunix's safetensors loader is not used here; transformers and
torch, test extras of the project, are not installed there and tunix's sampler does not
need them).

Against tunix's sampler
-----------------------
On the CPU, niced (other timed work may share the cores), tiny-5m at V=512:

  nice -n 15 python -m experiments.tunix_compare \
      --batches=16,64 --min_repeats=5 --out=tunix_compare.json
  nice -n 15 python -m experiments.tunix_compare \
      --batches=256 --min_repeats=5 --out=tunix_compare_256.json

Measured 2026-12-05 at 74391ee (rl_batch/ as at 4502057), 2 shared cores, tunix 0.1.7,
jax 0.10.2: weight mapping max |logit difference| 1.3e-6 (9.5e-7 of the largest);
greedy tokens equal in 100% of rows at B = 16, 64 and 256; B = 64, P = 16, R = 128:
ours 9773 tok/s against tunix's 7660, 1.28x wall (1.50x in CPU seconds: 1.11 against
1.67 s per call), host load 2.2. B = 16: 1.27x wall, 1.44x CPU. At B = 256 the host load
(2.8 to 3.4) spread each sampler's wall times 2-3x between rounds (wall ratio 2.02 in
one run, 1.22 in the next); its CPU seconds were steady: 1.72x and 1.76x.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from experiments import cli, throughput
from rl_batch import bench, provenance
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import sampler as sampler_lib

# tunix 0.1.7's Qwen3 attention calls apply_rope without the config's theta: 1e6 always.
TUNIX_ROPE_THETA = 1_000_000.0
# Full-forward logits of the two models may differ by this fraction of the largest |logit|.
PARITY_RTOL = 1e-4
GREEDY = sampler_lib.SamplingConfig(greedy=True)

# experiments.throughput's flags that mean the same here, with this script's defaults.
SHARED_FLAG_DEFAULTS = {
    "preset": "tiny-5m",
    "vocab_size": 512,
    "batches": ["64"],
    "prompt_len": 16,
    "new_tokens": 128,
    "min_repeats": 3,
    "min_time_s": 1.0,
    "seed": 0,
    "out": None,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """The flags as data (a test builds them directly)."""

    preset: str = "tiny-5m"
    vocab_size: int = 512
    batches: tuple[int, ...] = (64,)
    prompt_len: int = 16
    new_tokens: int = 128
    min_repeats: int = 3
    min_time_s: float = 1.0
    seed: int = 0


# ---------------------------------------------------------------------------- models


def model_config(settings: Settings) -> model_lib.ModelConfig:
    """The preset with ``--vocab_size``, tunix's RoPE theta and room for P + R tokens."""
    config = model_lib.get_preset(
        settings.preset, vocab_size=settings.vocab_size, rope_theta=TUNIX_ROPE_THETA
    )
    length = settings.prompt_len + settings.new_tokens
    return config.replace(max_seq_len=max(config.max_seq_len, length))


def random_params(config: model_lib.ModelConfig, seed: int) -> model_lib.Params:
    """``init_params`` with every RMSNorm scale drawn from 1 + 0.1 N(0, 1).

    ``init_params`` sets the scales to 1, where a mapping that swapped two norms (or the
    q and k norms) would still give the same logits.
    """
    params = model_lib.init_params(config, seed)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    keys = iter(jax.random.split(jax.random.key(seed + 1), len(leaves)))
    new = []
    for path, leaf in leaves:
        key = next(keys)
        if jax.tree_util.keystr(path).endswith("['scale']"):
            leaf = 1.0 + 0.1 * jax.random.normal(key, leaf.shape, leaf.dtype)
        new.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, new)


def check_tunix_compatible(config: model_lib.ModelConfig) -> None:
    """Raises ValueError if tunix's dense Qwen3 cannot hold a model of ``config``."""
    problems = []
    if not config.qk_norm:
        problems.append("qk_norm=False (tunix's Qwen3 always has q/k norms)")
    if config.qkv_bias:
        problems.append("qkv_bias=True (tunix's Qwen3 has none)")
    if config.num_experts:
        problems.append("num_experts > 0 (only the dense model is mapped)")
    if config.head != "lm":
        problems.append(f"head={config.head!r} (tunix's Qwen3 is an LM)")
    if config.rope_theta != TUNIX_ROPE_THETA:
        problems.append(f"rope_theta={config.rope_theta} (tunix 0.1.7 applies 1e6)")
    if config.dtype != "float32" or config.param_dtype != "float32":
        problems.append("dtype/param_dtype other than float32")
    if problems:
        raise ValueError("model config not comparable with tunix's Qwen3: " + "; ".join(problems))


def tunix_config(config: model_lib.ModelConfig):
    """tunix's ``qwen3.model.ModelConfig`` of the same shape (float32)."""
    from tunix.models.qwen3 import model as tunix_qwen3_lib

    check_tunix_compatible(config)
    return tunix_qwen3_lib.ModelConfig(
        num_layers=config.num_layers,
        vocab_size=config.vocab_size,
        embed_dim=config.hidden_size,
        hidden_dim=config.intermediate_size,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        num_kv_heads=config.num_kv_heads,
        rope_theta=int(config.rope_theta),
        norm_eps=config.rms_norm_eps,
        use_tied_embedding=config.tie_embeddings,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
    )


def tunix_weights(config: model_lib.ModelConfig, params: model_lib.Params) -> dict:
    """Our parameter tree as tunix Qwen3's pure parameter dict (its
    ``nnx.state(model, nnx.Param).to_pure_dict()`` layout).

    Every projection keeps its layout: both store input-major weights (q [D, N, H],
    k and v [D, K, H], o [N, H, D], MLP kernels [in, out], embedding [V, D], an
    untied head [D, V]); only the names differ.
    """
    params = model_lib.unstack_layers(params) if model_lib.is_stacked(params) else params
    out: dict = {
        "embedder": {"input_embedding": params["embed_vd"]},
        "final_norm": {"w": params["final_norm"]["scale"]},
        "layers": {},
    }
    if not config.tie_embeddings:
        out["lm_head"] = {"w": params["lm_head_dv"]}
    for i in range(config.num_layers):
        layer = params["layers"][i] if i in params["layers"] else params["layers"][str(i)]
        attn, mlp = layer["attn"], layer["mlp"]
        out["layers"][i] = {
            "input_layernorm": {"w": layer["input_norm"]["scale"]},
            "post_attention_layernorm": {"w": layer["post_attn_norm"]["scale"]},
            "attn": {
                "q_proj": {"w": attn["q_dnh"]},
                "k_proj": {"w": attn["k_dkh"]},
                "v_proj": {"w": attn["v_dkh"]},
                "o_proj": {"w": attn["o_nhd"]},
                "q_norm": {"w": attn["q_norm"]["scale"]},
                "k_norm": {"w": attn["k_norm"]["scale"]},
            },
            "mlp": {
                "gate_proj": {"kernel": mlp["gate_df"]},
                "up_proj": {"kernel": mlp["up_df"]},
                "down_proj": {"kernel": mlp["down_fd"]},
            },
        }
    return out


def _flat(tree: dict, prefix: tuple = ()) -> dict[tuple, object]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= _flat(value, prefix + (key,))
        else:
            out[prefix + (key,)] = value
    return out


def tunix_qwen3(config: model_lib.ModelConfig, params: model_lib.Params):
    """tunix's ``Qwen3`` module holding our weights.

    Raises:
      ValueError: the mapping misses a tunix parameter, names one tunix lacks, or gives
        one a different shape.
    """
    from flax import nnx
    from tunix.models.qwen3 import model as tunix_qwen3_lib

    model = tunix_qwen3_lib.Qwen3(tunix_config(config), rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    theirs = _flat(state.to_pure_dict())
    ours = _flat(tunix_weights(config, params))
    if set(theirs) != set(ours):
        missing, extra = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
        raise ValueError(f"tunix weight mapping: missing {missing}, unexpected {extra}")
    for path, value in ours.items():
        if tuple(theirs[path].shape) != tuple(value.shape):
            raise ValueError(
                f"tunix weight mapping: {'/'.join(map(str, path))} is {value.shape} here, "
                f"{theirs[path].shape} in tunix"
            )
    nnx.replace_by_pure_dict(state, tunix_weights(config, params))
    nnx.update(model, state)
    return model


def tunix_forward(model, tokens_bt: np.ndarray) -> np.ndarray:
    """Full causal forward of tunix's Qwen3 (no cache), logits [B, T, V] float32."""
    b, t = tokens_bt.shape
    positions_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    mask_btt = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
    logits_btv, _ = model(jnp.asarray(tokens_bt, jnp.int32), positions_bt, None, mask_btt)
    return np.asarray(logits_btv)


def logit_parity(
    config: model_lib.ModelConfig, params: model_lib.Params, model, tokens_bt: np.ndarray
) -> dict[str, float]:
    """Max |logit difference| between our forward and tunix's, absolute and as a fraction
    of the largest |logit|."""
    ours_btv = np.asarray(model_lib.forward(config, params, jnp.asarray(tokens_bt)))
    theirs_btv = tunix_forward(model, tokens_bt)
    err = float(np.abs(ours_btv - theirs_btv).max())
    return {"max_abs": err, "max_rel": err / float(np.abs(ours_btv).max())}


# -------------------------------------------------------------------------- samplers


class IdTokenizer:
    """The tokenizer interface tunix's sampler takes, over strings of token ids
    (``"5 17 3"``). ``bos_id`` is None (no BOS added); pad and stop ids are given."""

    def __init__(self, pad_id: int, eos_id: int):
        self._pad, self._eos = pad_id, eos_id

    def encode(self, text: str, **_) -> list[int]:
        return [int(x) for x in text.split()]

    def decode(self, ids, **_) -> str:
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self):
        return None

    def eos_id(self) -> int:
        return self._eos

    def pad_id(self) -> int:
        return self._pad


def make_tunix_sampler(config: model_lib.ModelConfig, model, prompt_len: int, new_tokens: int):
    """tunix's ``Sampler`` over ``model`` with a P + R cache; pad id V and stop id V + 1,
    both outside the vocabulary."""
    from tunix.generate import sampler as tunix_sampler_lib

    cache = tunix_sampler_lib.CacheConfig(
        cache_size=prompt_len + new_tokens,
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
    )
    tokenizer = IdTokenizer(pad_id=config.vocab_size, eos_id=config.vocab_size + 1)
    return tunix_sampler_lib.Sampler(transformer=model, tokenizer=tokenizer, cache_config=cache)


def tunix_generate(sampler, prompts_bp: np.ndarray, new_tokens: int) -> np.ndarray:
    """Greedy tokens [B, R] from tunix's sampler (its public call, no stop)."""
    out = sampler(
        [" ".join(map(str, row)) for row in prompts_bp],
        max_generation_steps=new_tokens,
        max_prompt_length=prompts_bp.shape[1],
        eos_tokens=[sampler.tokenizer.eos_id()],
        temperature=0.0,
    )
    tokens_br = np.stack([np.asarray(t) for t in out.tokens])
    if tokens_br.shape != (prompts_bp.shape[0], new_tokens):
        raise RuntimeError(f"tunix returned {tokens_br.shape} tokens, expected R={new_tokens}")
    return tokens_br


def ours_generate(
    sampler: sampler_lib.Sampler, params: model_lib.Params, prompts_bp: np.ndarray, new: int
) -> np.ndarray:
    """Greedy tokens [B, R] from our sampler (its public call, no stop)."""
    out = sampler(params, prompts_bp.tolist(), rng=jax.random.key(0), sampling=GREEDY)
    if int(out.lengths.min()) != new:
        raise RuntimeError(f"our sampler stopped a row early: lengths {out.lengths}")
    return out.response_tokens


def agreement(
    config: model_lib.ModelConfig,
    params: model_lib.Params,
    prompts_bp: np.ndarray,
    ours_br: np.ndarray,
    theirs_br: np.ndarray,
) -> dict:
    """How far the two samplers' greedy tokens agree.

    Returns rows_equal and tokens_equal (fractions), and for each row that differs
    (``diverged``) its first differing step and the logit gap there: our forward on the
    prompt and our tokens, our token's logit less tunix's token's at that step (0 at an
    exact tie; a gap far above fp32 rounding of the logits would point at a real bug).
    """
    equal_b = (ours_br == theirs_br).all(axis=1)
    diverged = []
    rows = np.flatnonzero(~equal_b)
    if len(rows):
        p = prompts_bp.shape[1]
        seq_bt = np.concatenate([prompts_bp[rows], ours_br[rows]], axis=1)
        logits_btv = np.asarray(model_lib.forward(config, params, jnp.asarray(seq_bt)))
        for j, b in enumerate(rows):
            step = int(np.argmax(ours_br[b] != theirs_br[b]))
            logits_v = logits_btv[j, p - 1 + step]
            gap = float(logits_v[ours_br[b, step]] - logits_v[theirs_br[b, step]])
            scale = float(np.abs(logits_v).max())
            diverged.append({"row": int(b), "step": step, "logit_gap": gap, "logit_max": scale})
    return {
        "rows_equal": float(equal_b.mean()),
        "tokens_equal": float((ours_br == theirs_br).mean()),
        "diverged": diverged,
    }


# ------------------------------------------------------------------------------- run


def run(settings: Settings) -> dict:
    """Builds both models, checks the weight mapping, then per batch size checks the
    greedy tokens and times both samplers interleaved. Returns the JSON record."""
    import tunix

    config = model_config(settings)
    params = random_params(config, settings.seed)
    model = tunix_qwen3(config, params)
    p_len, new = settings.prompt_len, settings.new_tokens
    check_bt = np.random.RandomState(settings.seed).randint(0, config.vocab_size, (2, p_len + new))
    parity = logit_parity(config, params, model, check_bt)
    print(
        f"model {settings.preset} (V={config.vocab_size}, D={config.hidden_size}, "
        f"L={config.num_layers}, N={config.num_heads}, K={config.num_kv_heads}, "
        f"H={config.head_dim}, F={config.intermediate_size}, rope_theta={config.rope_theta:g}, "
        f"{config.num_params / 1e6:.2f}M params), prompt {p_len}, {new} new tokens, "
        f"device {throughput.device_description()}; tunix {tunix.__version__}, "
        f"jax {jax.__version__}",
        flush=True,
    )
    print(
        f"weight mapping: max |logit difference| {parity['max_abs']:.2e} "
        f"({parity['max_rel']:.2e} of the largest |logit|) on a [2, {p_len + new}] batch",
        flush=True,
    )
    if not parity["max_rel"] <= PARITY_RTOL:
        raise RuntimeError(f"tunix's model disagrees with ours: {parity}")

    ours = throughput._make_sampler(config, p_len, new)
    theirs = make_tunix_sampler(config, model, p_len, new)
    prompts_rng = np.random.RandomState(settings.seed + 1)
    rows, agreements = [], []
    for batch in settings.batches:
        prompts_bp = prompts_rng.randint(0, config.vocab_size, (batch, p_len))
        # Warm-up (compile) and the token check.
        ours_br = ours_generate(ours, params, prompts_bp, new)
        theirs_br = tunix_generate(theirs, prompts_bp, new)
        agree = agreement(config, params, prompts_bp, ours_br, theirs_br) | {"batch": batch}
        agreements.append(agree)
        gaps = [abs(d["logit_gap"]) for d in agree["diverged"]]
        print(
            f"batch {batch}: greedy tokens equal in {agree['rows_equal']:.1%} of rows, "
            f"{agree['tokens_equal']:.1%} of tokens"
            + (
                f"; rows that differ: first at step {min(d['step'] for d in agree['diverged'])}"
                f", |logit gap| there at most {max(gaps):.2e}"
                if gaps
                else ""
            ),
            flush=True,
        )
        timed = bench.time_interleaved(
            {
                "ours": lambda _, x=prompts_bp: ours_generate(ours, params, x, new),
                "tunix": lambda _, x=prompts_bp: tunix_generate(theirs, x, new),
            },
            min_repeats=settings.min_repeats,
            min_time_s=settings.min_time_s,
        )
        tunix_tps = batch * new / timed["tunix"].median_s
        for label, t in timed.items():
            time_s = t.median_s
            rows.append(
                {
                    "sampler": label,
                    "batch": batch,
                    "prompt_len": p_len,
                    "new_tokens": new,
                    "time_s": time_s,
                    "tokens_per_s": batch * new / time_s,
                    "ratio_to_tunix": batch * new / time_s / tunix_tps,
                    "cpu_s": t.median_cpu_s,
                    "load1": t.median_load1,
                    "repeats": t.repeats,
                    "times_s": t.time_s,
                }
            )
        print("\n".join(format_table(rows[-2:]).splitlines()[2:]), flush=True)
    print()
    print(format_table(rows))
    software = provenance.software() | {"google-tunix": tunix.__version__}
    return {
        "device": throughput.device_description(),
        "rows": rows,
        "parity": parity,
        "agreement": agreements,
        "settings": dataclasses.asdict(settings),
        "model_config": config.to_dict(),
        "software": software,
        "git": provenance.imported_git_state(),
    }


def format_table(rows: list[dict]) -> str:
    """Markdown: one line per sampler and batch. ratio: tokens/s over tunix's at the same
    batch (wall time); cpu s: median process CPU seconds of a call (all threads), less
    sensitive than wall time to other processes on the cores."""
    columns = ["sampler", "batch", "P", "R", "time s", "tok/s", "ratio", "load1", "cpu s"]
    return bench.markdown_table(
        columns,
        [
            [
                r["sampler"],
                r["batch"],
                r["prompt_len"],
                r["new_tokens"],
                f"{r['time_s']:.3f}",
                f"{r['tokens_per_s']:.0f}",
                f"{r['ratio_to_tunix']:.2f}",
                f"{r['load1']:.2f}",
                f"{r['cpu_s']:.3f}",
            ]
            for r in rows
        ],
    )


# ------------------------------------------------------------------------------ main


def settings_from_flags() -> Settings:
    f = flags.FLAGS
    return Settings(
        preset=f.preset,
        vocab_size=f.vocab_size,
        batches=tuple(int(b) for b in f.batches),
        prompt_len=f.prompt_len,
        new_tokens=f.new_tokens,
        min_repeats=f.min_repeats,
        min_time_s=f.min_time_s,
        seed=f.seed,
    )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    # experiments.throughput's own flags mean nothing here.
    module_flags = flags.FLAGS.flags_by_module_dict().get(throughput.__name__, [])
    foreign = sorted(
        f"--{fl.name}" for fl in module_flags if fl.present and fl.name not in SHARED_FLAG_DEFAULTS
    )
    if foreign:
        raise app.UsageError(f"{', '.join(foreign)}: experiments.throughput flags, unused here")
    if importlib.util.find_spec("tunix") is None:
        raise app.UsageError(
            "tunix is not installed (google-tunix; see experiments/tunix_compare.py's docstring)"
        )
    jax.config.update("jax_num_cpu_devices", 1)
    results = run(settings_from_flags())
    if flags.FLAGS.out:
        with open(flags.FLAGS.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {flags.FLAGS.out}")


if __name__ == "__main__":
    for _name, _default in SHARED_FLAG_DEFAULTS.items():
        flags.FLAGS.set_default(_name, _default)
    cli.run(main)
