"""Experiment configs (``get_config()`` files for ``--config=``)."""

import os

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
    """Absolute path of a config file here, so defaults work from any directory."""
    return os.path.join(CONFIG_DIR, name)
