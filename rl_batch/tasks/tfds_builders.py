"""TFDS datasets of the synthetic tasks: fixed splits in ArrayRecord files, no TensorFlow.

One builder, ``rl_batch_synthetic``, with one `SyntheticConfig` per (task, knobs, seed,
split sizes). Preparing writes ``train``/``validation``/``test`` as ``array_record`` files
under ``<data_dir>/rl_batch_synthetic/<config name>/<version>/``; later calls reuse them.
Reading goes through ``tfds.data_source`` (random access over ArrayRecord, which needs no
TensorFlow: the GeneratorBasedBuilder writer serialises examples with tfds's numpy-only
example serializer when TensorFlow is absent).

Splits are drawn from one seed: validation first (distinct prompts), then test (distinct
prompts, none in validation), then train (any prompt not in validation or test; train
may repeat prompts). So evaluation prompts are never trained on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow_datasets as tfds
from etils import epath

from rl_batch import locks
from rl_batch.tasks.base import Example
from rl_batch.tasks.plugin import draw_splits
from rl_batch.tasks.registry import get_task, task_kwargs

SPLITS = ("train", "validation", "test")
_BUILDER_NAME = "rl_batch_synthetic"


@dataclasses.dataclass(eq=False)
class SyntheticConfig(tfds.core.BuilderConfig):
    """Which task, with which knobs, seed and split sizes (see `make_config`)."""

    task: str = "addition"
    task_kwargs_json: str = "{}"
    seed: int = 0
    n_train: int = 20_000
    n_validation: int = 512
    n_test: int = 512


def _slug(value: Any) -> str:
    return re.sub(r"[^\w.]", "", str(value))


def make_config(
    task_name: str,
    seed: int = 0,
    n_train: int = 20_000,
    n_validation: int = 512,
    n_test: int = 512,
    **task_knobs: Any,
) -> SyntheticConfig:
    """The builder config of a task; its name encodes the knobs plus a hash of everything.

    Args:
        task_name: a registered synthetic task (``addition``, ``multiplication``,
            ``countdown``).
        seed: seed of the split generation.
        n_train, n_validation, n_test: split sizes.
        **task_knobs: the task's options (defaults filled in from the task).

    Returns:
        A `SyntheticConfig` named e.g. ``addition-n_digits3-scratchpadFalse-seed0-1a2b3c4d``.
    """
    task = get_task(task_name, **task_knobs)  # Validates the name and knobs.
    knobs = task_kwargs(task)
    spec = {
        "task": task_name,
        "kwargs": knobs,
        "seed": seed,
        "sizes": [n_train, n_validation, n_test],
    }
    spec_json = json.dumps(spec, sort_keys=True)
    digest = hashlib.sha1(spec_json.encode()).hexdigest()[:8]
    readable = "-".join(f"{k}{_slug(v)}" for k, v in sorted(knobs.items()))
    return SyntheticConfig(
        name=f"{task_name}-{readable}-seed{seed}-{digest}",
        description=spec_json,
        task=task_name,
        task_kwargs_json=json.dumps(knobs, sort_keys=True),
        seed=seed,
        n_train=n_train,
        n_validation=n_validation,
        n_test=n_test,
    )


def generate_splits(config: SyntheticConfig) -> dict[str, list[Example]]:
    """Draws the three splits of a config (pure function of the config).

    Raises:
        ValueError: when the task has too few distinct prompts for the evaluation splits.
    """
    task = get_task(config.task, **json.loads(config.task_kwargs_json))
    sizes = {"validation": config.n_validation, "test": config.n_test, "train": config.n_train}
    return draw_splits(task, config.seed, sizes, config.name)


class RlBatchSynthetic(tfds.core.GeneratorBasedBuilder):
    """Synthetic verifiable tasks (prompt, reference answer, JSON meta)."""

    # Bump when the example generators change: the prepared files depend on them.
    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [
        make_config("addition"),
        make_config("addition", scratchpad=True),
        make_config("multiplication"),
        make_config("countdown"),
    ]

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        # TFDS 4.9.10's default looks up `importlib_resources.abc.Traversable` for builders
        # defined inside a package, but only declares the `importlib_resources` backport
        # for Python < 3.9, so on 3.11 without it preparation fails with
        # ModuleNotFoundError. The answer (this file) is known, so give it directly.
        return epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="rl_batch synthetic task: " + (self.builder_config.description or ""),
            features=tfds.features.FeaturesDict(
                {
                    "prompt": tfds.features.Text(),
                    "answer": tfds.features.Text(),
                    "meta": tfds.features.Text(),  # JSON
                }
            ),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # Nothing to download.
        splits = generate_splits(self.builder_config)
        return {name: self._generate_examples(splits[name]) for name in SPLITS}

    def _generate_examples(self, examples: Sequence[Example]) -> Iterator[tuple[int, dict]]:
        for i, ex in enumerate(examples):
            meta = json.dumps(dict(ex.meta), sort_keys=True)
            yield i, {"prompt": ex.prompt, "answer": ex.answer, "meta": meta}


class SplitSource(Sequence):
    """Random access to one prepared split; items are dicts with ``prompt``, ``answer``
    (str) and ``meta`` (dict). Supports ints, slices and `get_batch`."""

    def __init__(self, source, name: str):
        self._source = source
        self.name = name

    def __len__(self) -> int:
        return len(self._source)

    @staticmethod
    def _decode(record: dict) -> dict[str, Any]:
        def text(x):
            return x.decode("utf-8") if isinstance(x, bytes) else str(x)

        return {
            "prompt": text(record["prompt"]),
            "answer": text(record["answer"]),
            "meta": json.loads(text(record["meta"])),
        }

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self.get_batch(range(*key.indices(len(self))))
        index = int(key)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {key} out of range for {self.name} of length {len(self)}")
        return self._decode(self._source[index])

    def get_batch(self, indices) -> list[dict[str, Any]]:
        """Items at ``indices`` (one batched read)."""
        indices = [int(i) for i in indices]
        return [self._decode(r) for r in self._source.__getitems__(indices)]

    def __repr__(self) -> str:
        return f"SplitSource({self.name!r}, len={len(self)})"


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """Hides TFDS's per-split tqdm bars while preparing, and its two benign warnings (see
    `_benign_warning`), then restores both."""
    from tensorflow_datasets.core.utils import tqdm_utils

    was_active = getattr(tqdm_utils, "_active", True)
    tfds.display_progress_bar(False)
    absl_log = logging.getLogger("absl")
    absl_log.addFilter(_benign_warning)
    try:
        yield
    finally:
        absl_log.removeFilter(_benign_warning)
        tfds.display_progress_bar(was_active)


_BENIGN = (
    "has no dataset_info.json",  # a dataset not prepared yet (every first run)
    "Using custom data configuration",  # every task setting not in BUILDER_CONFIGS
)


def _benign_warning(record: logging.LogRecord) -> bool:
    """False (drop) for TFDS's benign warnings (`_BENIGN`)."""
    return not any(text in record.getMessage() for text in _BENIGN)


def _file_lock(directory: str):
    """Serialises preparation across processes sharing a data dir (e.g. a sweep's runs)."""
    return locks.held(os.path.join(directory, f".{_BUILDER_NAME}.lock"))


def load_split(
    task_name: str,
    split: str,
    data_dir: str | os.PathLike,
    seed: int = 0,
    n_train: int = 20_000,
    n_validation: int = 512,
    n_test: int = 512,
    **task_knobs: Any,
) -> SplitSource:
    """One split of a synthetic task, prepared into ``data_dir`` on first use.

    Args:
        task_name: ``addition``, ``multiplication`` or ``countdown``.
        split: ``train``, ``validation`` or ``test``.
        data_dir: the TFDS data directory.
        seed, n_train, n_validation, n_test: see `make_config`.
        **task_knobs: the task's options, e.g. ``n_digits=3``.

    Returns:
        A `SplitSource`: a random-access sequence of dicts.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    config = make_config(task_name, seed, n_train, n_validation, n_test, **task_knobs)
    # TFDS refuses a config object that shares its name with a predefined one; pass the
    # predefined config by name instead.
    predefined = {c.name for c in RlBatchSynthetic.BUILDER_CONFIGS}
    config_arg = config.name if config.name in predefined else config
    data_dir = os.fspath(data_dir)
    with _file_lock(data_dir), _quiet_progress():
        source = tfds.data_source(
            _BUILDER_NAME,
            split=split,
            data_dir=data_dir,
            builder_kwargs={"config": config_arg, "file_format": "array_record"},
        )
    return SplitSource(source, f"{config.name}/{split}")
