r"""Writes a run's policy as a Hugging Face model directory (config.json + safetensors).

    python -m experiments.export_hf --run_dir=RUN --out=DIR [--step=N] \
        [--dtype=bfloat16|float32] [--overwrite]

The latest checkpoint step is exported unless ``--step`` names another; only the policy
parameters are restored (PPO: the actor). transformers, vLLM and lm-eval load the result,
e.g. ``transformers.AutoModelForCausalLM.from_pretrained(DIR)``.

Tokenizer: a run started from a Hugging Face checkpoint (``init.source="hf"``) gets that
checkpoint's tokenizer files (tokenizer.json, tokenizer_config.json,
special_tokens_map.json, generation_config.json, chat templates) copied from
``init.path``. A synthetic-task run uses the character tokenizer, which has no Hugging
Face equivalent: there is no HF tokenizer, only the weights and config.json are written.
See `rl_batch.runs.export.export_run`.
"""

from absl import app, flags, logging

from experiments import cli

_RUN_DIR = flags.DEFINE_string("run_dir", None, "The run directory (config.json, checkpoints/).")
_OUT = flags.DEFINE_string("out", None, "The output directory (must be new or empty).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the latest).")
_DTYPE = flags.DEFINE_enum(
    "dtype", None, ["float32", "bfloat16"], "Stored dtype (default: the run's param dtype)."
)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace a non-empty --out.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _RUN_DIR.value or not _OUT.value:
        raise app.UsageError("set --run_dir=RUN and --out=DIR")
    from rl_batch.runs import export  # After flag parsing: jax reads XLA_FLAGS at import.

    logging.set_verbosity(logging.WARNING)  # Orbax logs every restore at INFO.
    # (An export.ExportError is a ValueError: one line, cli.run.)
    result = export.export_run(
        _RUN_DIR.value, _OUT.value, step=_STEP.value, dtype=_DTYPE.value, overwrite=_OVERWRITE.value
    )
    print(result.describe())


if __name__ == "__main__":
    cli.run(main)
