"""rl_batch: which batch size reaches a target model quality in the least wall time?"""

from setuptools import find_packages, setup

CORE = [
    "jax>=0.6",
    "flax>=0.11",
    "optax",
    "orbax-checkpoint",
    "numpy",
    "absl-py",
    "ml-collections",
    "tensorflow-datasets",
    "array_record",
    "math-verify",
    "safetensors",
    "tokenizers",
    # Renders a checkpoint's own chat template (tokenizer_config.json); without it
    # Hugging Face tokenizers would need a fallback template.
    "jinja2",
    "matplotlib",
    "scipy",  # Student-t quantiles of the analysis' intervals
    "tqdm",
]

TEST = [
    "pytest",
    "pytest-xdist",
    "chex",
    "ruff",
    "nbformat",
    "nbclient",
    "ipykernel",
    # Parity checks against the Hugging Face implementation only. The pin keeps pip
    # on the CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
    "torch==2.13.0",
    "transformers",
    # The TensorBoard and W&B backends of config.tracking (rl_batch.runs.tracking); optional
    # for runs, tested here with the packages themselves (W&B offline).
    "tensorboardX",
    "wandb",
    # transformers.Trainer (a real trainer_state.json for the importer's tests) needs it.
    "accelerate",
    # TRL's own GRPOConfig writes the training arguments of the importer's TRL tests.
    "trl",
]

# Readers of other frameworks' runs (rl_batch.analysis.importers, experiments.import_runs):
# TensorBoard's own event reader, parquet for exported W&B history (wandb reads .wandb).
IMPORT = ["tensorboard", "pyarrow", "wandb", "pyyaml"]

setup(
    name="rl_batch",
    version="0.1.0",
    description="Batch-size scaling for LLM reinforcement learning (GRPO/PPO) in JAX.",
    python_requires=">=3.10",
    packages=find_packages(
        include=["rl_batch", "rl_batch.*", "experiments", "experiments.*", "launch", "launch.*"]
    ),
    package_data={
        "rl_batch": ["data/*", "data/**/*"],
        # The key maps of rl_batch.analysis.importers (copied and edited by users).
        "rl_batch.analysis.importers": ["keymaps/*.json"],
        # The default studies' base policies (init.source="params") and their records.
        "experiments.configs": ["base_policies/*"],
    },
    install_requires=CORE,
    extras_require={
        "test": TEST + [p for p in IMPORT if p not in TEST],
        "import": IMPORT,
        "cuda": ["jax[cuda12]"],
        "tpu": ["jax[tpu]"],
    },
)
