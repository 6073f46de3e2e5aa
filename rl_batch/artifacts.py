"""Run and sweep directories: the contract between runs, sweeps and analysis.

A run directory::

    <run>/config.json      resolved config (every hyperparameter, LR rule, seed)
    <run>/provenance.json  package versions, git commit, devices, CPU, host load per session
                           (written and read by `rl_batch.provenance`)
    <run>/metrics.jsonl    one JSON object per optimizer update and per evaluation
    <run>/generations.jsonl  sampled validation prompts, responses and rewards
                           (``config.log_generations`` per validation; one line per prompt)
    <run>/tensorboard/, <run>/wandb/  dashboards of ``config.tracking`` (`rl_batch.runs.tracking`)
    <run>/checkpoints/     orbax checkpoints
    <run>/summary.json     N*, q, T (or "not reached"), time split, status

Each metrics line has ``"kind": "update"`` or ``"kind": "eval"``.

Update lines carry at least: ``step``, ``responses_cum`` (retained responses used in
updates so far), ``responses_generated_cum``, ``prompts``, ``group_size``,
``batch_responses`` (retained in this update), ``lr``, ``reward_mean``,
``time_generate_s``, ``time_score_s``, ``time_update_s``, ``time_train_cum_s``,
``gen_tokens``, ``grad_norm`` (actor), ``loss``, ``clip_frac``, ``kl`` and (lines written
since the update takes its clip range as an argument) ``clip_low``, ``clip_high``; PPO adds
``critic_grad_norm`` and ``phase`` (``PHASE_CRITIC_WARMUP`` or ``PHASE_TRAIN``). A math
task's lines add ``score_unverified_too_big`` and ``score_unverified_timeout``: responses
scored 0 without math_verify's verdict, too long or too deeply nested to verify, or past
the watchdog's time (``rl_batch.tasks.rewards.unverified_counts``; eval lines:
``eval_score_unverified_*``).

Eval lines carry: ``step``, ``responses_cum``, ``time_train_cum_s``, ``eval_accuracy``
(mean@k), ``eval_k``, ``eval_greedy_accuracy`` (optional), ``time_eval_s``.

``summary.json`` holds: ``status`` (``"running"``, ``"finished"``, ``"failed"``),
``target`` (validation accuracy target), ``reached`` (bool), ``n_star`` (retained
responses at the interpolated first crossing, ``null`` when not reached),
``updates_to_target`` (``null`` when not reached), ``q`` (retained responses per
second of training time up to the target, or over the whole run when not reached),
``time_to_target_s`` (``null`` when not reached), ``time_train_s``,
``time_generate_s``, ``time_score_s``, ``time_update_s``, ``time_idle_s``,
``time_eval_s``, ``time_compile_s``, ``responses_cum``, ``responses_generated_cum``,
``steps``, ``final_eval_accuracy``, ``error`` (when failed). Its N*, T, q and
updates-to-target come from ``rl_batch.targets`` on the metrics lines, the routine the
analysis uses: the two agree exactly.

A sweep directory::

    <sweep>/sweep.json        the grid and each run's status
    <sweep>/runs/<run-name>/  one run directory per grid point
    <sweep>/figures/*.png     figures (and PDF)
    <sweep>/report.md         tables

``sweep.json`` holds ``name``, the sweep settings of ``sweep_settings`` (``algo``,
``target``, ``target_band_lo``, ``target_crossing``, ``budget_responses``,
``eval_every_responses``), ``reference`` (run name of the reference configuration) and ``runs``: a
list of ``{"name", "prompts", "group_size", "lr_rule", "lr", "seed", "batch", "status",
"error"}`` (``sweep_entry``): ``lr`` is the run's effective LR (its config.json's
``derived.lr``, ``config_lr``) and ``batch`` the configured batch B = P x G (the
config's ``derived.batch``). ``batch_responses`` means one thing: the responses an
update retained (update lines); entries written before the rename carry the configured
batch under that name, which ``entry_batch`` still reads.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
GENERATIONS_FILE = "generations.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
SWEEP_FILE = "sweep.json"
RUNS_DIR = "runs"
FIGURES_DIR = "figures"
REPORT_FILE = "report.md"
CALIBRATION_FILE = "calibration.json"  # rl_batch.sweeps.calibrate
CALIBRATIONS_DIR = "calibrations"  # earlier calibration.json files, kept when one is redone
CALIBRATION_VERSION = 1

NOT_REACHED = "not reached"

# Where the programs' default output directories lie (``sweeps/``, ``workdir/``):
# the working directory, or this directory when the variable is set (the test suite sets
# it to a temporary one, so that no test reads or writes a checkout's outputs).
DEFAULT_ROOT_ENV = "RL_BATCH_DEFAULT_ROOT"


def default_dir(*parts: str) -> str:
    """A default output path: ``os.path.join(*parts)`` relative to the working
    directory, or under ``$RL_BATCH_DEFAULT_ROOT`` when it is set."""
    root = os.environ.get(DEFAULT_ROOT_ENV)
    return os.path.normpath(os.path.join(root, *parts)) if root else os.path.join(*parts)


# ``phase`` of an update line: PPO's critic-only warm-up, then actor training (GRPO: all).
PHASE_CRITIC_WARMUP = "critic_warmup"
PHASE_TRAIN = "train"


# ---------------------------------------------------------------------- disk full


class DiskFullError(OSError):
    """A write into ``directory`` failed with ENOSPC. Its message is one line naming the
    directory; what was written before it is intact (the run resumes with --resume)."""

    def __init__(self, directory: str):
        super().__init__(
            errno.ENOSPC,
            f"disk full: no space left to write in {directory}; free space there, then "
            "continue the run with --resume (everything written before is intact)",
        )
        self.directory = directory

    def __str__(self) -> str:
        return self.strerror


# tensorstore and orbax report ENOSPC as text in errors of their own.
_ENOSPC_TEXT = os.strerror(errno.ENOSPC)  # "No space left on device"


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from or while handling, is ENOSPC."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if _ENOSPC_TEXT in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


# sweep.json's settings, shared by every run of a sweep (``sweep_settings``): the
# algorithm, the estimator (target, band, crossing: runs that differ in one are not one
# sweep) and the runway (budget and eval interval: a longer runway may extend some runs).
SWEEP_ESTIMATOR_KEYS = ("algo", "target", "target_band_lo", "target_crossing")
SWEEP_RUNWAY_KEYS = ("budget_responses", "eval_every_responses")
SWEEP_SETTING_KEYS = SWEEP_ESTIMATOR_KEYS + SWEEP_RUNWAY_KEYS
# A run config without ``target_crossing`` reads N* as the run loop does by default.
DEFAULT_TARGET_CROSSING = "update"


def sweep_settings(config: Any) -> dict[str, Any]:
    """The sweep-level settings of sweep.json, read off a run config (the one builder:
    ``rl_batch.sweeps.sweep`` from the sweep's base config, ``launch/collect`` from each
    collected run's ``config.json``).

    Args:
      config: a run or sweep config (a mapping or ConfigDict with top-level ``algo``,
        ``target``, ``target_band_lo``, ``target_crossing``, ``budget_responses``,
        ``eval_every_responses``).

    Returns:
      ``{key: value}`` for each of ``SWEEP_SETTING_KEYS`` (None where the config has no
      value; ``target_crossing`` defaults to ``DEFAULT_TARGET_CROSSING``, as the run
      loop reads it).
    """
    out = {k: config.get(k) for k in SWEEP_SETTING_KEYS}
    if out["target_crossing"] is None:
        out["target_crossing"] = DEFAULT_TARGET_CROSSING
    return out


# The fields of a run's entry in sweep.json (``sweep_entry``); writers may add more.
SWEEP_ENTRY_CONFIG_KEYS = ("prompts", "group_size", "lr_rule", "lr", "seed")
SWEEP_ENTRY_FIELDS = (
    "name", *SWEEP_ENTRY_CONFIG_KEYS, "critic", "variant", "batch", "status", "error"
)  # fmt: skip
# Fields of entries written by older code, read by ``entry_batch`` (never written now).
OLD_SWEEP_ENTRY_FIELDS = ("batch_responses",)


def sweep_entry(
    name: str,
    *,
    prompts: Any,
    group_size: Any,
    lr_rule: Any,
    lr: Any,
    seed: Any,
    status: str,
    error: str | None = None,
    batch: Any = None,
    critic: str = "",
    variant: str = "",
) -> dict[str, Any]:
    """A run's entry in sweep.json (the one builder: ``rl_batch.sweeps.sweep``, ``launch/collect``).

    ``batch`` is the configured training batch B = P x G (GRPO's batch unit; PPO has
    G = 1), filled in from ``prompts`` and ``group_size`` when not given (the update
    lines' ``batch_responses`` count the responses each update retained instead).
    ``critic`` is a PPO point's critic variant (`critic_variant`; ``""`` at the defaults),
    ``variant`` its named variant (``""``: none).
    """
    if batch is None and isinstance(prompts, int) and isinstance(group_size, int):
        batch = prompts * group_size
    return {
        "name": name,
        "prompts": prompts,
        "group_size": group_size,
        "lr_rule": lr_rule,
        "critic": critic,
        "variant": variant,
        "lr": lr,
        "seed": seed,
        "batch": batch,
        "status": status,
        "error": error,
    }


# ---------------------------------------------------------------------------- sweep.json

# sweep.json's top-level fields in their order (`sweep_record`); a writer may add more
# after them (the importer's ``imported``).
SWEEP_RECORD_KEYS = ("name", *SWEEP_SETTING_KEYS, "reference", "reference_key", "grid", "runs")


# sweep.json's grid field `equivalence_delta`: two configurations whose T ratio is shown
# inside 1 +- delta are equivalent (rl_batch.analysis.equivalence).
DEFAULT_EQUIVALENCE_DELTA = 0.05


def check_equivalence_delta(delta: Any, where: str = "") -> float:
    """``delta`` as a float in (0, 1), or a one-line ValueError naming it (and ``where``)."""
    ok = isinstance(delta, (int, float)) and not isinstance(delta, bool)
    if not ok or not (0 < delta < 1):
        at = f"{where}." if where else ""
        raise ValueError(f"{at}equivalence_delta must be a number in (0, 1), got {delta!r}")
    return float(delta)


def sweep_record(
    name: str,
    settings: Any,
    runs: list[dict[str, Any]],
    *,
    reference: str | None = None,
    reference_key: str | None = None,
    grid: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """sweep.json's contents (the one builder; `write_sweep` writes them).

    Args:
      name: the sweep's name (its directory's base name, unless given).
      settings: a mapping with the sweep settings (`sweep_settings` of a config, or
        collected from the runs); each of ``SWEEP_SETTING_KEYS`` is taken (None if absent).
      runs: one `sweep_entry` per run (writers may add fields to an entry, e.g.
        ``key``, ``wall_s``).
      reference: the reference run's name (None: the analysis takes the smallest batch).
      reference_key: its configuration (``"PxG:rule"``); left out when None.
      grid: the sweep program's ``sweep`` section; left out when None.
      **extra: further top-level fields, after the others.

    Returns:
      The record, its keys in the order of ``SWEEP_RECORD_KEYS``, then ``extra``.
    """
    record = {"name": name, **{k: settings.get(k) for k in SWEEP_SETTING_KEYS}}
    record["reference"] = reference
    if reference_key is not None:
        record["reference_key"] = reference_key
    if grid is not None:
        record["grid"] = grid
    record["runs"] = list(runs)
    clash = sorted(set(extra) & set(SWEEP_RECORD_KEYS))
    if clash:
        raise ValueError(f"sweep_record: {clash} are sweep.json's own fields, not extras")
    return {**record, **extra}


def write_sweep(path: str, record: dict[str, Any]) -> None:
    """Writes a `sweep_record` atomically to ``path`` (``<sweep>/sweep.json``, or a job's
    ``<run>/sweep_point.json``): the one writer of the format.

    Raises:
      ValueError: a record without a name, the settings or a list of named runs with a
        status (not what `sweep_record` builds).
    """
    missing = [k for k in ("name", *SWEEP_SETTING_KEYS, "reference", "runs") if k not in record]
    runs = record.get("runs")
    if missing or not isinstance(runs, list):
        raise ValueError(f"{path}: not a sweep record (missing {missing or ['runs (a list)']})")
    bad = [r for r in runs if not isinstance(r, dict) or "name" not in r or "status" not in r]
    if bad:
        raise ValueError(f"{path}: run entries without a name and status: {bad[:2]}")
    write_json_atomic(path, record)


# ----------------------------------------------------------------------- extensions.json

EXTENSIONS_FILE = "extensions.json"  # <sweep>/extensions.json: the grid extension's rounds


def read_extensions(sweep_dir: str) -> dict[str, Any]:
    """``<sweep>/extensions.json`` (``{"rounds": [], "stopped": ""}`` when absent).

    Format (written by ``rl_batch.sweeps.extend``, read by it and the report):
    ``{"version": 1, "rounds": [{"points": ["PxG:rule", ...], "reason": str, "best":
    config name}], "stopped": why the extension stopped ("" while it runs), "grid":
    {"points": run names, "reference": key} (the grid extended; absent in older files)}``.
    """
    path = os.path.join(sweep_dir, EXTENSIONS_FILE)
    if not os.path.exists(path):
        return {"version": 1, "rounds": [], "stopped": ""}
    obj = read_json(path)
    rounds = obj.get("rounds") if isinstance(obj, dict) else None
    if not isinstance(rounds, list) or not all(
        isinstance(r, dict) and isinstance(r.get("points"), list) for r in rounds
    ):
        raise ValueError(f"{path}: expected {{'rounds': [{{'points': [...]}}, ...]}}")
    out = {"version": 1, "rounds": rounds, "stopped": str(obj.get("stopped", ""))}
    return {**out, "grid": obj["grid"]} if obj.get("grid") else out


def write_extensions(sweep_dir: str, ext: dict[str, Any]) -> None:
    """Writes `read_extensions`'s record to ``<sweep>/extensions.json`` atomically."""
    write_json_atomic(os.path.join(sweep_dir, EXTENSIONS_FILE), ext)


CALIBRATION_AHEAD_FILE = "calibration_ahead.json"  # configurations timed before their runs


def read_calibration_ahead(sweep_dir: str) -> dict[str, dict[str, Any]]:
    """``"PxG:rule"`` -> the run config (a ``config.json``'s content) of each point a
    calibration times ahead of its runs (empty when ``<sweep>/calibration_ahead.json``
    is absent).

    Format (written by ``rl_batch.sweeps.extend`` before each pass of an extending
    sweep, read by ``rl_batch.sweeps.calibrate.sweep_configs``): ``{"version": 1,
    "configs": {"PxG:rule": config}}``: the smaller-side points the grid extension
    could add (``rl_batch.analysis.extension.ahead_points``).
    """
    path = os.path.join(sweep_dir, CALIBRATION_AHEAD_FILE)
    if not os.path.exists(path):
        return {}
    obj = read_json(path)
    configs = obj.get("configs") if isinstance(obj, dict) else None
    if not isinstance(configs, dict) or not all(isinstance(c, dict) for c in configs.values()):
        raise ValueError(f"{path}: expected {{'configs': {{'PxG:rule': config, ...}}}}")
    return {str(k): c for k, c in configs.items()}


def entry_batch(entry: dict[str, Any]) -> Any:
    """The configured batch B = P x G of a sweep.json entry: ``batch``, or
    ``batch_responses`` in an entry written before the rename, else prompts x group_size
    (None when unknown)."""
    for key in ("batch", "batch_responses"):
        if entry.get(key) is not None:
            return entry[key]
    prompts, group_size = entry.get("prompts"), entry.get("group_size")
    if isinstance(prompts, int) and isinstance(group_size, int):
        return prompts * group_size
    return None


def config_lr(config: dict[str, Any]) -> Any:
    """A run's effective policy LR from its config.json: ``derived.lr`` (resolve keeps
    the input ``lr``, None when the rule derives it), or, in a config.json written before
    ``derived.lr`` existed, ``lr`` (which resolve overwrote with the effective LR then)."""
    derived = config.get("derived")
    if isinstance(derived, dict) and "lr" in derived:
        return derived["lr"]
    return config.get("lr")


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One configuration of a sweep (its seeds are runs of it): the one identity of a
    (prompts, group size, LR rule, PPO critic variant, named variant) and each of its
    spellings.

    - ``key``: the grid's, e.g. ``"16x8:sqrt"`` or ``"16x8:sqrt@warmup"``
      (``sweep.extra_points``, ``sweep.reference``, ``--reference``; `parse_key` reads
      it back);
    - ``run_name(seed)``: a run directory's, e.g. ``"p16_g8_sqrt_s0"``;
    - ``name``: with the algorithm, e.g. ``"grpo-P16-G8-sqrt"`` (tables, ``--reference``);
    - ``label``: for figures, e.g. ``"P=16 G=8 sqrt"``.

    ``variant`` names a set of config settings off the sweep's base config
    (``sweep.variants``, e.g. a batch-size schedule or a hyperparameter rule; ``""``:
    none); P and G are then the configured (for a schedule, the largest) batch. The
    run config records it as ``variant`` (`variant_of`).
    """

    algo: str
    prompts: int
    group_size: int
    lr_rule: str
    critic: str = ""  # PPO critic settings off their defaults (`critic_variant`)
    variant: str = ""  # a named set of settings off the base config (`sweep.variants`)

    @property
    def batch(self) -> int:
        """Training batch in responses, B = P x G."""
        return self.prompts * self.group_size

    @property
    def key(self) -> str:
        """The grid's spelling, e.g. ``"64x8:sqrt"``, or ``"64x1:sqrt:k2"`` for a PPO
        critic off its defaults."""
        key = f"{self.prompts}x{self.group_size}:{self.lr_rule}"
        key = f"{key}:{self.critic}" if self.critic else key
        return f"{key}@{self.variant}" if self.variant else key

    def run_name(self, seed: int) -> str:
        """The run directory of one seed, e.g. ``"p16_g8_sqrt_s0"``."""
        critic = f"_{self.critic}" if self.critic else ""
        variant = f"_{self.variant}" if self.variant else ""
        return f"p{self.prompts}_g{self.group_size}_{self.lr_rule}{critic}{variant}_s{seed}"

    @property
    def name(self) -> str:
        """With the algorithm, e.g. ``"grpo-P128-G8-sqrt"``."""
        critic = f"-{self.critic}" if self.critic else ""
        variant = f"-{self.variant}" if self.variant else ""
        return f"{self.algo}-P{self.prompts}-G{self.group_size}-{self.lr_rule}{critic}{variant}"

    @property
    def label(self) -> str:
        """Short label for figures and tables, e.g. ``"P=128 G=8 sqrt"``."""
        critic = f" critic {self.critic}" if self.critic else ""
        variant = f" {self.variant}" if self.variant else ""
        return f"P={self.prompts} G={self.group_size} {self.lr_rule}{critic}{variant}"

    @property
    def family(self) -> tuple[str, str, str, str]:
        """What a batch-size family shares: algorithm, LR rule, critic, variant."""
        return (self.algo, self.lr_rule, self.critic, self.variant)

    def sort_key(self) -> tuple[Any, ...]:
        """Order of tables and figures: algorithm, batch, group size, rule, critic,
        variant."""
        return (self.algo, self.batch, self.group_size, self.lr_rule, self.critic, self.variant)


def point_key(
    prompts: int, group_size: int, lr_rule: str, critic: str = "", variant: str = ""
) -> str:
    """``Configuration.key`` from its parts (the algorithm does not enter the key)."""
    return Configuration("", prompts, group_size, lr_rule, critic, variant).key


VARIANT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


def check_variant_name(name: str) -> str:
    """``name`` if it can name a variant (lower-case letters, digits, ``-``; not empty);
    else a ValueError that names it."""
    if not name or not set(name) <= VARIANT_CHARS or name.startswith("-"):
        raise ValueError(
            f"bad variant name {name!r}: expected lower-case letters, digits and '-', "
            "e.g. 'warmup' or 'adam-sde'"
        )
    return name


def parse_key(text: str) -> tuple[int, int, str, str | None, str]:
    """Parses ``"PxG:rule[:critic][@variant]"`` into (prompts, group_size, rule, critic,
    variant) (`parse_point_key`; variant ``""`` when the key has none)."""
    base, at, variant = text.strip().partition("@")
    if at:
        try:
            check_variant_name(variant)
        except ValueError as e:
            raise ValueError(f"bad sweep point {text!r}: {e}") from None
    return (*parse_point_key(base), variant)


def variant_of(config: Any) -> str:
    """A run config's named variant (``variant``; ``""`` when none or not recorded)."""
    return str(config.get("variant") or "")


def parse_point_key(text: str) -> tuple[int, int, str, str | None]:
    """Parses ``"PxG:rule[:critic]"`` into (prompts, group_size, rule, critic); critic is
    None when the key has no critic part. ValueError if malformed."""
    try:
        batch, rule, *rest = text.strip().split(":")
        prompts, group = batch.lower().split("x")
        if len(rest) > 1:
            raise ValueError
        critic = None
        if rest:
            k, critic_rule = parse_critic_variant(rest[0])
            critic = critic_variant(k, critic_rule, rule.strip())
        return int(prompts), int(group), rule.strip(), critic
    except ValueError:
        raise ValueError(
            f"bad sweep point {text!r}: expected 'PxG:rule', e.g. '64x8:sqrt', or for PPO "
            "'PxG:rule:kK[-critic_rule]', e.g. '64x1:sqrt:k2' or '64x1:sqrt:k1-fixed'"
        ) from None


def critic_variant(batch_scale: int, critic_lr_rule: str, lr_rule: str) -> str:
    """The PPO critic's settings as a key part: ``""`` at the defaults (batch scale 1, the
    actor's LR rule), else ``"k<scale>"`` plus ``"-<rule>"`` when the rule differs."""
    rule = "" if critic_lr_rule in ("", lr_rule) else critic_lr_rule
    if int(batch_scale) == 1 and not rule:
        return ""
    return f"k{int(batch_scale)}" + (f"-{rule}" if rule else "")


def parse_critic_variant(text: str) -> tuple[int, str]:
    """``"k2"`` -> (2, ""), ``"k1-fixed"`` -> (1, "fixed"), ``""`` -> (1, ""); ValueError
    if malformed."""
    if not text:
        return 1, ""
    scale, _, rule = text.partition("-")
    if not scale.startswith("k") or not scale[1:].isdigit() or int(scale[1:]) < 1:
        raise ValueError(f"bad critic variant {text!r}: expected 'k<scale>[-<rule>]'")
    return int(scale[1:]), rule


def critic_variant_of(config: Any) -> str:
    """`critic_variant` of a run config (a mapping or ConfigDict); ``""`` unless PPO."""
    if config.get("algo") != "ppo":
        return ""
    ppo = config.get("ppo") or {}
    return critic_variant(
        ppo.get("critic_batch_scale", 1) or 1,
        ppo.get("critic_lr_rule", "") or "",
        config.get("lr_rule", ""),
    )


def _umask() -> int:
    """The process's umask, read without changing it where the kernel says it
    (``/proc/self/status``); else set and put back at once."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_default_mode(path: str) -> None:
    """Sets ``path``'s mode to what ``open()`` would have given it (0666 less the umask:
    0644 as a rule): a library that writes 0600 (safetensors) leaves files others of
    the group cannot read."""
    os.chmod(path, 0o666 & ~_umask())


def write_json_atomic(path: str, obj: Any) -> None:
    """Writes JSON so that a reader (or a crash) never sees a half-written file.

    The file gets the mode a plain ``open(path, "w")`` would give it (0644 under umask
    022), not ``mkstemp``'s private 0600: teammates on a shared cluster read run files.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=json_default)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if is_disk_full(e):  # the old file at ``path`` is untouched
            raise DiskFullError(directory) from e
        raise


def read_json(path: str) -> Any:
    """Reads a JSON file, naming the file in the error when it is malformed."""
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: malformed JSON: {e}") from e


def append_jsonl(path: str, record: dict[str, Any]) -> None:
    """Appends one JSON line and flushes it to disk.

    Raises:
      DiskFullError: the disk is full; the file is cut back to its earlier lines (no
        partial line is left behind).
    """
    size = os.path.getsize(path) if os.path.exists(path) else 0
    try:
        with open(path, "a") as f:
            f.write(json.dumps(record, sort_keys=True, default=json_default) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if not is_disk_full(e):
            raise
        if os.path.exists(path) and os.path.getsize(path) > size:
            os.truncate(path, size)  # needs no space
        raise DiskFullError(os.path.dirname(os.path.abspath(path))) from e


def iter_jsonl(path: str) -> Iterator[dict[str, Any]]:
    """Yields the records of a JSONL file.

    A truncated last line (a crash mid-write) is ignored; any other malformed line is an
    error that names the file and the line number.
    """
    with open(path) as f:
        lines = f.readlines()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) and not line.endswith("\n"):
                return  # Torn final write: the record never completed.
            raise ValueError(f"{path}:{i}: malformed JSON line: {e}") from e


def read_metrics(run_dir: str, kind: str | None = None) -> list[dict[str, Any]]:
    """Returns the metrics records of a run, optionally only one ``kind``."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    return [r for r in iter_jsonl(path) if kind is None or r.get("kind") == kind]


def json_roundtrip(obj: Any) -> Any:
    """``obj`` as JSON would give it back (numpy scalars as numbers, tuples as lists)."""
    return json.loads(json.dumps(obj, default=json_default))


def json_default(obj: Any) -> Any:
    """``json.dumps``'s ``default`` for numpy / jax scalars and arrays."""
    # numpy / jax scalars and arrays.
    if hasattr(obj, "item") and getattr(obj, "size", 2) == 1:
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def calibration_generation(record: dict[str, Any] | None) -> dict[float, list[float]] | None:
    """Concurrency -> per-visit generated tokens/s of a ``calibration.json`` record (its
    configurations' rollouts and its generation probes), or None when it has no generation
    timing (files written before it was recorded)."""
    if not record:
        return None
    by_c: dict[float, list[float]] = {}
    for entry in record.get("configs", {}).values():
        if "gen_concurrency" not in entry or not entry.get("gen_tokens_per_s"):
            return None
        by_c.setdefault(float(entry["gen_concurrency"]), []).extend(
            float(x) for x in entry["gen_tokens_per_s"]
        )
    for entry in record.get("gen_probe", {}).values():  # generation alone, past the grid
        by_c.setdefault(float(entry["gen_concurrency"]), []).extend(
            float(x) for x in entry["gen_tokens_per_s"]
        )
    return by_c or None


def read_calibration_generation(sweep_dir: str) -> dict[float, list[float]] | None:
    """`calibration_generation` of ``<sweep>/calibration.json`` (None without one)."""
    path = os.path.join(sweep_dir, CALIBRATION_FILE)
    return calibration_generation(read_json(path)) if os.path.exists(path) else None


def read_calibration_rounds(sweep_dir: str) -> dict[str, list[float]] | None:
    """``"PxG:rule"`` -> calibrated seconds per training step in each round (round r of
    every configuration was timed in one rotation), or None when the sweep has none or
    a configuration lacks them."""
    path = os.path.join(sweep_dir, CALIBRATION_FILE)
    if not os.path.exists(path):
        return None
    raw = read_json(path)
    try:
        out = {str(k): [float(x) for x in v["step_s"]] for k, v in raw["configs"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # (read_calibration names a malformed file)
    return out if len({len(v) for v in out.values()}) == 1 else None


def read_calibration_blocks(sweep_dir: str) -> tuple[int, ...] | None:
    """Each calibration round's block (``round_blocks``: rounds timed before the runs, then
    after them, ``rl_batch.sweeps.calibrate``), or None: one block (a record without them,
    or none)."""
    path = os.path.join(sweep_dir, CALIBRATION_FILE)
    if not os.path.exists(path):
        return None
    blocks = read_json(path).get("round_blocks")
    try:
        return tuple(int(b) for b in blocks) if blocks else None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: malformed calibration record (round_blocks: {e!r})") from e


def calibration_block_sizes(rounds: int, before: int) -> list[int]:
    """Rounds per calibration block: ``[before, rounds - before]`` (timed before the runs
    and after them), or ``[rounds]`` (after them) when ``before`` is 0; a ValueError unless
    each of two blocks has 2 or more rounds."""
    if before and not 2 <= before <= rounds - 2:
        raise ValueError(
            f"{before} of {rounds} calibration rounds before the runs: each block needs 2 or "
            "more (0: all after them)"
        )
    return [before, rounds - before] if before else [rounds]


def _block_sizes(record: dict[str, Any]) -> list[int]:
    blocks = record.get("round_blocks") or [0] * int(record.get("rounds") or 0)
    return [blocks.count(b) for b in sorted(set(blocks))]


def read_calibration_prompts(sweep_dir: str) -> dict[str, dict[int, list[float]]]:
    """``"PxG:rule@variant"`` -> {P: calibrated step seconds per round} of each
    configuration with a batch-size schedule (``prompts_step_s``; empty when none)."""
    path = os.path.join(sweep_dir, CALIBRATION_FILE)
    if not os.path.exists(path):
        return {}
    raw = read_json(path)
    try:
        return {
            str(k): {int(p): [float(x) for x in xs] for p, xs in v["prompts_step_s"].items()}
            for k, v in raw["configs"].items()
            if "prompts_step_s" in v
        }
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: malformed calibration record ({e!r})") from e


def read_calibration(sweep_dir: str) -> dict[str, float] | None:
    """``"PxG:rule"`` -> calibrated seconds per training step (``rl_batch.sweeps.calibrate``'s
    ``<sweep>/calibration.json``), or None when the sweep has none."""
    path = os.path.join(sweep_dir, CALIBRATION_FILE)
    if not os.path.exists(path):
        return None
    raw = read_json(path)
    try:
        return {str(k): float(v["step_s_median"]) for k, v in raw["configs"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: malformed calibration record ({e!r})") from e


# ------------------------------------------------------------------ calibration state


def sweep_run_configs(sweep_dir: str) -> dict[str, dict[str, Any]]:
    """``"PxG:rule"`` -> the ``config.json`` of its first run listed in sweep.json that has
    one: the configurations a calibration times (``rl_batch.sweeps.calibrate``)."""
    record = read_json(os.path.join(sweep_dir, SWEEP_FILE))
    configs: dict[str, dict[str, Any]] = {}
    for entry in record.get("runs", []):
        path = os.path.join(sweep_dir, RUNS_DIR, entry["name"], CONFIG_FILE)
        if not os.path.exists(path):
            continue
        c = read_json(path)
        key = point_key(
            c["prompts"], c["group_size"], c["lr_rule"], critic_variant_of(c), variant_of(c)
        )
        configs.setdefault(key, c)
    return configs


def calibration_stale(
    sweep_dir: str,
    rounds: int,
    steps: int,
    gen_probe: tuple[int, ...] = (),
    before: int = 0,
    keys: Sequence[str] = (),
) -> list[str]:
    """Why ``<sweep>/calibration.json`` does not serve the sweep as it is now (empty: it
    does, and is kept): none yet, unreadable, a configuration it did not time (of the
    sweep's runs, or of ``keys``: the grid's, before its runs), or other calibration
    settings (rounds, steps, generation probes, rounds per block: ``before`` of them timed
    before the runs) than asked for.

    A calibration is redone only for one of these, so rerunning a finished sweep keeps
    its T and q; the one it replaces is kept (``archive_calibration``).
    """
    path = os.path.join(sweep_dir, CALIBRATION_FILE)
    if not os.path.exists(path):
        return ["no calibration.json yet"]
    try:
        record = read_json(path)
        timed = set(record["configs"])
    except (ValueError, KeyError, TypeError) as e:
        return [f"{path} unreadable ({e})"]
    reasons = []
    new = sorted((set(sweep_run_configs(sweep_dir)) | set(keys)) - timed)
    if new:
        reasons.append(f"configurations not calibrated yet: {', '.join(new)}")
    for name, asked in (("rounds", rounds), ("steps", steps)):
        if record.get(name) is not None and record[name] != asked:
            reasons.append(f"{name} {record[name]} -> {asked}")
    probes = sorted(int(c) for c in record.get("gen_probe", {}))
    if probes != sorted(int(c) for c in gen_probe):
        reasons.append(f"generation probes {probes} -> {sorted(gen_probe)}")
    sizes, asked = _block_sizes(record), calibration_block_sizes(rounds, before)
    if not reasons and sizes != asked:
        reasons.append(f"rounds per block {sizes} -> {asked}")
    return reasons


def calibration_action(
    sweep_dir: str,
    rounds: int,
    steps: int,
    gen_probe: tuple[int, ...] = (),
    before: int = 0,
    keys: Sequence[str] = (),
) -> tuple[str, list[str]]:
    """What a sweep's calibration does now, and why: ``"keep"`` (`calibration_stale` finds
    nothing), ``"append"`` (the record is this calibration's block before the runs, with
    every configuration and these settings: the rounds after the runs join it) or
    ``"redo"``."""
    stale = calibration_stale(sweep_dir, rounds, steps, gen_probe, before, keys)
    if not stale:
        return "keep", []
    if before and not calibration_stale(sweep_dir, before, steps, gen_probe, 0, keys):
        return "append", [f"{before} rounds before the runs; {rounds - before} to time after"]
    return "redo", stale


def archive_calibration(sweep_dir: str) -> str | None:
    """Moves ``<sweep>/calibration.json`` to ``<sweep>/calibrations/calibration-<n>.json``
    (n = 1, 2, ... in the order they were replaced); returns the new path (None: none)."""
    path = os.path.join(sweep_dir, CALIBRATION_FILE)
    if not os.path.exists(path):
        return None
    folder = os.path.join(sweep_dir, CALIBRATIONS_DIR)
    os.makedirs(folder, exist_ok=True)
    n = len(os.listdir(folder)) + 1
    while os.path.exists(os.path.join(folder, f"calibration-{n}.json")):
        n += 1
    dest = os.path.join(folder, f"calibration-{n}.json")
    os.replace(path, dest)
    return dest


def calibration_note(sweep_dir: str) -> str | None:
    """Which calibration the analysis uses, for report.md: ``calibration.json`` with when
    it was written, its rounds and configurations, and the earlier ones kept (None when
    the sweep has no calibration.json)."""
    path = os.path.join(sweep_dir, CALIBRATION_FILE)
    if not os.path.exists(path):
        return None
    try:
        record = read_json(path)
    except ValueError:
        return f"`{CALIBRATION_FILE}` (unreadable)"
    if not isinstance(record, dict):
        return f"`{CALIBRATION_FILE}` (unreadable)"
    written = record.get("written_at") or "time not recorded"
    parts = [f"written {written}"]
    if record.get("rounds") is not None:
        parts.append(f"{record['rounds']} rounds of {record.get('steps', '?')} steps")
    sizes = _block_sizes(record)
    if len(sizes) > 1:
        parts.append(f"in blocks of {' + '.join(map(str, sizes))} rounds (before / after the runs)")
    parts.append(f"{len(record.get('configs') or {})} configurations")
    folder = os.path.join(sweep_dir, CALIBRATIONS_DIR)
    earlier = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    if earlier:
        parts.append(f"{len(earlier)} earlier calibration(s) kept in `{CALIBRATIONS_DIR}/`")
    return f"`{CALIBRATION_FILE}` ({'; '.join(parts)})"
