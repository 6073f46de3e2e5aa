"""A run's policy as a Hugging Face model directory (``experiments.export_hf``).

``export_run(run_dir, out)`` reads the run's resolved ``config.json``, rebuilds its model
config, restores only the policy parameters of one checkpoint step (GRPO:
``state.params``; PPO: the actor, ``state.actor.params``; no optimizer state, critic or
reference is read) and writes ``config.json`` + ``model.safetensors`` with
`rl_batch.models.hf.save_hf_checkpoint`, which transformers, vLLM and lm-eval load.

Tokenizer: a run that started from a Hugging Face checkpoint (``init.source == "hf"``)
uses that checkpoint's tokenizer, so its tokenizer files (``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json``, ``generation_config.json``, chat
templates, ...) are copied from ``init.path`` into the output, and its token ids
(``bos_token_id``, ``eos_token_id``, ``pad_token_id``) and ``model_type`` are kept in
config.json. A synthetic-task run uses `rl_batch.tokenizers.CharTokenizer`, which has no
Hugging Face counterpart: only the weights and config.json are written, and token ids
are those of the character tokenizer.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Any

from rl_batch import artifacts
from rl_batch.models import hf
from rl_batch.models import transformer as model_lib
from rl_batch.runs import config as config_lib
from rl_batch.runs import retention
from rl_batch.runs.checkpoint import Checkpointer

# Files of a Hugging Face model directory that describe its tokenizer and generation
# defaults; each is copied when present.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
# config.json fields of the source checkpoint kept in the exported one.
_TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")
DTYPES = ("float32", "bfloat16")


class ExportError(ValueError):
    """The run or the output directory cannot be exported to / from (one-line message)."""


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What `export_run` wrote."""

    out: str
    step: int
    model_type: str
    dtype: str
    files: tuple[str, ...]  # every file written into ``out``, sorted
    tokenizer_source: str | None  # init.path the tokenizer files came from; None: none

    def describe(self) -> str:
        """A few lines for the command's output."""
        lines = [
            f"exported step {self.step} as {self.model_type} ({self.dtype}) to {self.out}:",
            *(f"  {name}" for name in self.files),
        ]
        if self.tokenizer_source is None:
            lines.append(
                "no Hugging Face tokenizer: this run uses the character tokenizer of its "
                "synthetic task, so only the weights and config.json were written"
            )
        else:
            lines.append(f"tokenizer files copied from {self.tokenizer_source}")
        return "\n".join(lines)


def infer_model_type(config: model_lib.ModelConfig) -> str:
    """The HF family a config fits: qwen3_moe (experts), qwen3 (qk_norm), qwen2 (qkv
    bias), else llama."""
    if config.num_experts:
        return "qwen3_moe"
    if config.qk_norm:
        return "qwen3"
    return "qwen2" if config.qkv_bias else "llama"


def check_out_dir(out: str, overwrite: bool = False) -> None:
    """Raises ExportError when ``out`` exists and is not an empty directory (unless
    ``overwrite``, which still refuses a path that is a file)."""
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise ExportError(f"--out {out} exists and is not a directory")
    if os.listdir(out) and not overwrite:
        raise ExportError(f"--out {out} exists and is not empty; pass --overwrite to replace it")


def copy_tokenizer_files(source: str, out: str) -> list[str]:
    """Copies the `TOKENIZER_FILES` present in ``source`` into ``out``; returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        path = os.path.join(source, name)
        if os.path.isfile(path):
            shutil.copyfile(path, os.path.join(out, name))
            copied.append(name)
    return copied


def export_run(
    run_dir: str,
    out: str,
    step: int | None = None,
    dtype: str | None = None,
    *,
    overwrite: bool = False,
) -> ExportResult:
    """Writes the policy of a run's checkpoint as a Hugging Face model directory.

    Every check (config.json, checkpoints, the step, the output directory, the dtype)
    runs before anything is restored or written.

    Args:
      run_dir: a run directory (``config.json`` and ``checkpoints/``).
      out: the output directory; must not exist or be empty unless ``overwrite`` (then
        its contents are deleted first).
      step: the checkpoint step; None: the latest.
      dtype: "float32" or "bfloat16" for the stored tensors; None: the run's parameter
        dtype (float32 master weights by default).
      overwrite: replace a non-empty ``out``.

    Returns:
      An `ExportResult` (``describe()`` gives a summary).

    Raises:
      ExportError: no config.json, no checkpoint, a missing step (the message lists the
        available ones), a non-empty ``out``, an unknown dtype, or a config that has no
        Hugging Face equivalent.
    """
    run_dir, out = os.path.abspath(run_dir), os.path.abspath(out)
    config_path = os.path.join(run_dir, artifacts.CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise ExportError(f"{run_dir} is not a run directory: no {artifacts.CONFIG_FILE}")
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"dtype {dtype!r} is not supported; expected one of {DTYPES}")
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)
    if not os.path.isdir(ckpt_dir):
        raise ExportError(f"no checkpoint in {run_dir}: {ckpt_dir} does not exist")
    ckpt = Checkpointer(ckpt_dir)
    try:
        steps = ckpt.all_steps()
        if not steps:
            if os.path.exists(os.path.join(ckpt_dir, retention.REMOVED_FILE)):
                raise ExportError(
                    f"no checkpoint in {ckpt_dir}: the sweep removed them when the run "
                    "finished (sweep.keep_checkpoints); run the point again with "
                    "--config.sweep.keep_checkpoints=all in a new --sweep_dir"
                )
            raise ExportError(f"no checkpoint in {ckpt_dir}")
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise ExportError(f"no step {step} in {ckpt_dir}; available steps: {steps}")
        check_out_dir(out, overwrite)

        spec = config_lib.load_spec(artifacts.read_json(config_path))
        c, model_config = spec.inputs, spec.model
        from_hf = c.init.source == "hf"
        source_hf = hf.read_hf_config(c.init.path) if from_hf else {}
        model_type = source_hf.get("model_type") or infer_model_type(model_config)
        export_config = model_config
        if dtype is not None:
            export_config = model_config.replace(param_dtype=dtype, dtype=dtype)
        try:
            hf.config_to_hf(export_config, model_type)
        except ValueError as e:
            raise ExportError(f"this run's model has no Hugging Face equivalent: {e}") from e

        params: Any = ckpt.restore_policy_params(model_lib.abstract_params(model_config), step)
    finally:
        ckpt.close()

    if os.path.isdir(out) and overwrite:
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    extra = {k: source_hf[k] for k in _TOKEN_ID_FIELDS if source_hf.get(k) is not None}
    hf.save_hf_checkpoint(export_config, params, out, model_type=model_type, extra_config=extra)
    if from_hf:
        copy_tokenizer_files(c.init.path, out)
    return ExportResult(
        out=out,
        step=step,
        model_type=model_type,
        dtype=export_config.param_dtype,
        files=tuple(sorted(os.listdir(out))),
        tokenizer_source=c.init.path if from_hf else None,
    )
