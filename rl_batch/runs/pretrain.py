"""Supervised warm start: a base policy that already solves the task sometimes.

RL needs a starting policy whose groups contain both successes and failures (the study
starts from an instruct model). ``train_base`` fits the model to reference responses
(``BOS prompt answer EOS``, loss on the answer and EOS only) and stops as soon as the
validation accuracy reaches ``pretrain.stop_accuracy`` (or after ``pretrain.steps``), so
the base policy leaves room for RL. ``pretrain.stop_metric`` is that accuracy:
``"sampled"`` (temperature 1, one response per prompt on ``eval_prompts`` prompts: its
standard error of ~0.04 moves where the warm start ends, and so where RL starts, by as
much) or ``"p_ref"``, the exact mean p(reference response) over the validation split
(``rl_batch.algorithms.exact_eval``), where only the training itself decides. ``base_params``
caches the result under ``<work_dir>/base/<key>/``, keyed by everything that determines
it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from ml_collections import ConfigDict

from rl_batch import artifacts, locks
from rl_batch.algorithms import exact_eval
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import groups as rollout_lib
from rl_batch.rollout.sampler import SamplingConfig
from rl_batch.runs import config as config_lib
from rl_batch.runs import sections
from rl_batch.runs.checkpoint import Checkpointer, path_name
from rl_batch.runs.spec import RunSpec
from rl_batch.tasks.plugin import is_plugin
from rl_batch.tasks.tfds_builders import load_split
from rl_batch.tokenizers import encode_prompt

log = logging.getLogger(__name__)


def source_digest(code_spec: str) -> str | None:
    """sha256 of the source file a ``file.py:Name`` or ``package.module:Name`` spec names
    (None when it names no file that can be read: a built-in task)."""
    module, sep, _ = str(code_spec or "").rpartition(":")
    if not sep or not module:
        return None
    path = module if module.endswith(".py") else None
    if path is None:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        path = found.origin if found is not None else None
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def cache_key(spec: RunSpec) -> str:
    """A short hash of everything that determines the base policy: the task, model and
    pretraining settings, and the source of a task class or reward function of the
    user's (``task.name``, ``task.reward_fn``): an edited ``my_task.py`` trains anew."""
    c = spec.inputs
    fields = {
        "task": c.task.to_dict(),
        "model": spec.model.to_dict(),
        "pretrain": c.pretrain.to_dict(),
    }
    code = {
        field: digest
        for field in ("name", "reward_fn")
        if (digest := source_digest(c.task.get(field))) is not None
    }
    if code:  # (built-in tasks keep the keys, and the caches, they had)
        fields["code"] = code
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", c.task.name)  # (a plug-in's "dir/file.py:Class")
    return f"{name}-{c.model.preset}-{digest}"


def cache_dir(spec: RunSpec) -> str:
    """``<work_dir>/base/<cache_key>``: where the warm start of ``spec`` is cached."""
    return os.path.join(os.path.abspath(spec.inputs.work_dir), "base", cache_key(spec))


def warm_start_info(spec: RunSpec) -> dict[str, Any]:
    """What the run's warm start is: ``{"dir": its cache directory, "info": its
    ``info.json`` (None when absent or unreadable), "pretrain": the pretrain settings}``
    (the advice of a run whose rollouts are never rewarded,
    ``accounting.no_signal_advice``)."""
    directory = cache_dir(spec)
    try:
        info = artifacts.read_json(os.path.join(directory, "info.json"))
    except (OSError, ValueError):
        info = None
    return {"dir": directory, "info": info, "pretrain": spec.inputs.pretrain.to_dict()}


def make_sequences(tokenizer, examples: list[dict], length: int):
    """Tokens [N, L] (right-padded), input mask [N, L] and loss mask [N, L].

    The loss mask marks positions whose *next* token is part of the answer or the EOS,
    i.e. ``logits[:, t]`` is trained to predict ``tokens[:, t + 1]`` where it is True.
    """
    n = len(examples)
    tokens = np.full((n, length), tokenizer.pad_id, np.int32)
    input_mask = np.zeros((n, length), bool)
    loss_mask = np.zeros((n, length), bool)
    for i, ex in enumerate(examples):
        prompt = encode_prompt(tokenizer, ex["prompt"])
        answer = tokenizer.encode(ex["answer"]) + [tokenizer.eos_id]
        seq = (prompt + answer)[:length]
        tokens[i, : len(seq)] = seq
        input_mask[i, : len(seq)] = True
        loss_mask[i, len(prompt) - 1 : len(seq) - 1] = True
    return tokens, input_mask, loss_mask


def make_train_step(model_config: model_lib.ModelConfig, optimizer: optax.GradientTransformation):
    """A jitted supervised step: (params, opt_state, tokens, input_mask, loss_mask) -> ..."""

    def loss_fn(params, tokens_bl, input_mask_bl, loss_mask_bl):
        logits_blv = model_lib.forward(model_config, params, tokens_bl, input_mask_bt=input_mask_bl)
        logp_bl = model_lib.token_logprobs(logits_blv[:, :-1], tokens_bl[:, 1:])
        mask = loss_mask_bl[:, :-1]
        return -jnp.sum(logp_bl * mask) / jnp.maximum(mask.sum(), 1)

    @jax.jit
    def step(params, opt_state, tokens_bl, input_mask_bl, loss_mask_bl):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens_bl, input_mask_bl, loss_mask_bl)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def base_splits(c: ConfigDict, task: Any) -> tuple[Any, Any]:
    """The (train, validation) examples the warm start of resolved ``c`` trains and
    stops on (the task's TFDS splits in ``<work_dir>/data``, or a plug-in's own)."""
    if is_plugin(c.task.name):
        return sections.Task.from_config(c.task).plugin_splits(task)
    data_dir = os.path.join(os.path.abspath(c.work_dir), "data")
    kwargs = dict(c.task.kwargs.to_dict(), n_train=c.task.n_train, n_validation=c.task.n_validation)
    return (
        load_split(c.task.name, "train", data_dir, **kwargs),
        load_split(c.task.name, "validation", data_dir, **kwargs),
    )


def stop_scorer(c: ConfigDict, model_config, tokenizer, val) -> exact_eval.ReferenceScorer:
    """The exact p_ref of ``pretrain.stop_metric="p_ref"``: over the whole validation split."""
    return exact_eval.ReferenceScorer(
        model_config, tokenizer, val.get_batch(range(len(val))), temperature=c.sampling.temperature
    )


def train_base(spec: RunSpec, *, progress: bool = True) -> tuple[Any, dict[str, Any]]:
    """Trains the warm-start policy of a resolved run from scratch.

    Returns:
      (params, info) where info has ``val_greedy_accuracy``, ``val_mean_at_k``, ``steps``,
      ``wall_s`` and the loss curve.
    """
    c = spec.config
    p = c.pretrain
    task = config_lib.make_task(c)
    tokenizer = config_lib.make_tokenizer(c)
    model_config = spec.model
    train, val = base_splits(c, task)
    val_examples = val.get_batch(range(min(p.eval_prompts, len(val))))
    length = spec.max_prompt_len + spec.max_new_tokens

    schedule = optax.warmup_cosine_decay_schedule(0.0, p.lr, p.warmup_steps, p.steps, p.lr * 0.1)
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01)
    )
    params = model_lib.init_params(model_config, p.seed)
    opt_state = optimizer.init(params)
    step_fn = make_train_step(model_config, optimizer)
    sampler = config_lib.make_sampler(spec, tokenizer)
    scorer = None  # the exact stop metric (no sampling noise in where the warm start ends)
    if p.get("stop_metric", "sampled") == "p_ref":
        scorer = stop_scorer(c, model_config, tokenizer, val)
    rng = np.random.default_rng(p.seed)
    t0 = time.time()
    losses, evals, accuracy, step = [], [], 0.0, 0
    for step in range(1, p.steps + 1):
        idx = rng.integers(0, len(train), p.batch_size)
        tokens, input_mask, loss_mask = make_sequences(tokenizer, train.get_batch(idx), length)
        params, opt_state, loss = step_fn(params, opt_state, tokens, input_mask, loss_mask)
        if scorer is not None and (step % p.eval_every == 0 or step == p.steps):
            accuracy = scorer(params)["eval_p_ref"]
            losses.append((step, float(loss)))
            evals.append((step, None, accuracy))
            if progress and (step % (10 * p.eval_every) == 0 or accuracy >= p.stop_accuracy):
                print(f"[pretrain] step {step}/{p.steps} loss {float(loss):.3f} p_ref "
                      f"{accuracy:.4f} ({time.time() - t0:.0f}s)", flush=True)  # fmt: skip
            if accuracy >= p.stop_accuracy:
                break
            continue
        if step % p.eval_every == 0 or step == p.steps:
            losses.append((step, float(loss)))
            ev = rollout_lib.evaluate(
                sampler,
                params,
                task,
                tokenizer,
                val_examples,
                k=1,
                rng=jax.random.key(step),
                sampling=SamplingConfig(),
                greedy=True,
            )
            # Sampled accuracy at temperature 1 is what RL's groups see.
            accuracy = ev["eval_accuracy"]
            evals.append((step, ev["eval_greedy_accuracy"], accuracy))
            if progress:
                print(
                    f"[pretrain] step {step}/{p.steps} loss {float(loss):.3f} "
                    f"greedy acc {ev['eval_greedy_accuracy']:.3f} sampled acc {accuracy:.3f} "
                    f"({time.time() - t0:.0f}s)",
                    flush=True,
                )
            if accuracy >= p.stop_accuracy:
                break
    final = rollout_lib.evaluate(
        sampler,
        params,
        task,
        tokenizer,
        val_examples,
        k=4,
        rng=jax.random.key(0),
        sampling=SamplingConfig(temperature=c.sampling.temperature),
        greedy=True,
    )
    info = {
        "key": cache_key(spec),
        "steps": step,
        "wall_s": time.time() - t0,
        "val_greedy_accuracy": final["eval_greedy_accuracy"],
        "val_mean_at_4": final["eval_accuracy"],
        "val_prompts": len(val_examples),
        "losses": losses,
        "evals": evals,
        "task": c.task.to_dict(),
        "model": model_config.to_dict(),
        "pretrain": p.to_dict(),
    }
    return params, info


HOST_PARAMS_FILE = "params.npz"  # the cached params as host arrays, for multi-process runs


def base_params(spec: RunSpec, *, progress: bool = True) -> Any:
    """The cached warm-start params of a resolved run; trained and cached on first use.

    Under several processes (``jax.distributed``) the training loop and its orbax
    checkpoint are single-process things, so process 0 has a one-process child (on the
    CPU) train or restore the warm start and write it as host arrays
    (``<cache>/params.npz``, `export_host_params`); every process then reads that file.
    ``work_dir`` must be on a filesystem every process sees, as the run directory is.
    """
    directory = cache_dir(spec)
    model_config = spec.model
    if jax.process_count() > 1:
        return _base_params_multiprocess(spec, directory, model_config)
    like = {"params": model_lib.abstract_params(model_config)}
    # (Concurrent runs of a sweep take turns: the first trains it, the others restore it.)
    with locks.held(directory + ".lock"):
        ckpt = Checkpointer(directory, max_to_keep=1)
        if ckpt.latest_step() is not None:
            tree, _ = ckpt.restore(like)
            return tree["params"]
        if jax.process_index() == 0 and progress:
            print(f"[pretrain] no base policy in {directory}: training one", flush=True)
        params, info = train_base(spec, progress=progress)
        ckpt.save(info["steps"], {"params": params}, {"key": info["key"]})
        artifacts.write_json_atomic(os.path.join(directory, "info.json"), info)
        ckpt.close()
    return params


def export_host_params(spec: RunSpec) -> str:
    """Writes the warm-start params of ``spec`` (trained first if not cached) as
    ``<cache>/params.npz`` (array names are their tree paths); returns its path."""
    params = base_params(spec, progress=False)
    path = os.path.join(cache_dir(spec), HOST_PARAMS_FILE)
    write_params_file(path, params)
    return path


def write_params_file(path: str, params: Any) -> None:
    """Writes ``params`` as host arrays named by their tree paths (``.npz``), atomically:
    the file format of `export_host_params` and of ``init.source="params"``."""
    named = {
        path_name(keys): np.asarray(x) for keys, x in jax.tree_util.tree_leaves_with_path(params)
    }
    tmp = path + ".tmp.npz"
    np.savez(tmp, **named)
    os.replace(tmp, path)


def load_params_file(path: str, model_config: model_lib.ModelConfig) -> Any:
    """A `write_params_file` file in the model's params structure, as jax arrays (a file
    written in the other layer layout, stacked or per layer, is converted).

    Raises:
      ValueError: an array of the model is missing or has another shape (one line naming
        the file and the array), or the file holds arrays the model does not have.
    """
    with np.load(path) as named:
        names = set(named.files)

        def leaf(keys, like):
            name = path_name(keys)
            if name not in names or named[name].shape != tuple(like.shape):
                raise ValueError(f"{path}: no array {name} of shape {tuple(like.shape)}")
            return jnp.asarray(named[name], dtype=like.dtype)

        file_config = model_config
        if not model_config.num_experts:  # (a MoE model has one layout)
            per_layer = any(name.startswith("layers/0/") for name in names)
            file_config = model_config.replace(scan_layers=not per_layer)
        like = model_lib.abstract_params(file_config)
        params = jax.tree_util.tree_map_with_path(leaf, like)
        extra = names - {path_name(k) for k, _ in jax.tree_util.tree_leaves_with_path(like)}
        if extra:
            raise ValueError(f"{path}: arrays the model does not have: {sorted(extra)[:3]}")
        return model_lib.to_layout(model_config, params)


WARM_START_WAIT_S = 6 * 3600  # how long other processes wait for process 0's warm start


def _base_params_multiprocess(spec: RunSpec, directory: str, model_config) -> Any:
    """`base_params` under several processes (see its docstring). The others wait for
    process 0's file (a collective would time out while it trains), or its failure
    note, ``params.failed``."""
    path = os.path.join(directory, HOST_PARAMS_FILE)
    failed = os.path.join(directory, "params.failed")
    t_enter = time.time()
    if jax.process_index() == 0 and not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        if os.path.exists(failed):
            os.remove(failed)
        config_path = os.path.join(directory, "export_config.json")
        artifacts.write_json_atomic(config_path, spec.to_json())
        env = {k: v for k, v in os.environ.items() if k != "RL_BATCH_DISTRIBUTED"}
        env["JAX_PLATFORMS"] = "cpu"  # (the accelerators belong to this run)
        code = (
            "import json, sys; from rl_batch.runs import config, pretrain; "
            "pretrain.export_host_params(config.load_spec(json.load(open(sys.argv[1]))))"
        )
        n = jax.process_count()
        print(f"[pretrain] preparing the warm start for {n} processes", flush=True)
        proc = subprocess.run(
            [sys.executable, "-c", code, config_path], env=env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            message = f"warm start for {directory} failed:\n{proc.stderr[-3000:]}"
            with open(failed, "w") as f:
                f.write(message)
            raise RuntimeError(message)
    deadline = time.monotonic() + WARM_START_WAIT_S
    while not os.path.exists(path):
        # (A note from an earlier launch, older than this wait, is not this one's.)
        if os.path.exists(failed) and os.path.getmtime(failed) > t_enter - 5.0:
            raise RuntimeError(open(failed).read())
        if time.monotonic() > deadline:
            raise TimeoutError(f"no warm start at {path} after {WARM_START_WAIT_S} s")
        time.sleep(1.0)
    return load_params_file(path, model_config)
