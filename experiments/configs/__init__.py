"""Experiment configs (``get_config()`` files for ``--config=``)."""

import os

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
    """Absolute path of a config file here, so defaults work from any directory."""
    return os.path.join(CONFIG_DIR, name)


def base_policy(name: str) -> str:
    """Absolute path of a shipped base policy (``base_policies/<name>.npz``: the params
    of `experiments.pretrain --export`; ``<name>.json`` beside it records how it was made)."""
    return os.path.join(CONFIG_DIR, "base_policies", name + ".npz")
