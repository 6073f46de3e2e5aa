"""Dashboards (rl_batch.runs.tracking) and sampled generations (generations.jsonl)."""

import os
import re
import struct
import sys
import types

import numpy as np
import pytest

from rl_batch import artifacts
from rl_batch.runs import config as config_lib
from rl_batch.runs import run as run_lib
from rl_batch.runs import tracking
from tests.run_fixtures import tiny_run_config


class FakeBackend:
    """Records every call it gets; one list shared by all instances (all sessions)."""

    calls: list = []
    infos: list = []
    responses: list = []

    def __init__(self, info):
        FakeBackend.infos.append(info)

    def log_metrics(self, step, metrics, responses=None):
        FakeBackend.calls.append(("metrics", step, dict(metrics)))
        FakeBackend.responses.append(responses)

    def log_generations(self, step, rows):
        FakeBackend.calls.append(("generations", step, list(rows)))

    def close(self):
        FakeBackend.calls.append(("close",))


@pytest.fixture
def fake_backend(monkeypatch):
    FakeBackend.calls, FakeBackend.infos, FakeBackend.responses = [], [], []
    monkeypatch.setitem(tracking.BACKENDS, "fake", (None, FakeBackend))
    return FakeBackend


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("work"))


@pytest.mark.slow  # 4 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_every_metrics_line_is_forwarded_once_in_order_and_not_resent_on_resume(
    work_dir, tmp_path, fake_backend
):
    run_dir = str(tmp_path / "run")

    def config(budget):
        return tiny_run_config(
            work_dir, run_dir, budget_responses=budget, tracking="jsonl,fake", log_generations=8
        )

    run_lib.run(config(48), progress=False)  # 3 updates, checkpointed at step 3
    first = len(FakeBackend.calls)
    assert FakeBackend.calls[-1] == ("close",) and FakeBackend.infos[0].resumed_step is None
    run_lib.run(config(96), progress=False)  # resumes at step 3
    assert FakeBackend.infos[1].resumed_step == 3
    assert FakeBackend.calls[first:].count(("close",)) == 1

    records = artifacts.read_metrics(run_dir)
    sent = [
        (step, m) for kind, *rest in FakeBackend.calls if kind == "metrics" for step, m in [rest]
    ]
    assert [step for step, _ in sent] == [r["step"] for r in records]
    for (_, metrics), record in zip(sent, records):
        assert metrics == tracking.scalars(record)
        assert metrics[f"{record['kind']}/responses_cum"] == record["responses_cum"]
    # Each line's cumulative retained responses go with it (the dashboards' responses axis).
    assert FakeBackend.responses == [int(r["responses_cum"]) for r in records]

    # generations.jsonl: every prompt of each validation (log_generations = eval_prompts),
    # each validation once (the resumed run cut nothing it had not redone); the rewards
    # are the task's for the responses and average to the line's mean@k.
    rows = list(artifacts.iter_jsonl(os.path.join(run_dir, artifacts.GENERATIONS_FILE)))
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in rows] == [e["step"] for e in evals for _ in range(8)]
    task = config_lib.make_task(config(96))
    for e in evals:
        mine = [r for r in rows if r["step"] == e["step"]]
        assert all(len(r["responses"]) == len(r["rewards"]) == 2 for r in mine)
        assert np.mean([r["rewards"] for r in mine]) == pytest.approx(e["eval_accuracy"])
        for r in mine:
            example = {"prompt": r["prompt"], "answer": r["answer"]}
            assert r["rewards"] == [task.reward(example, x) for x in r["responses"]]
    gens = [(step, rows_) for kind, *rest in FakeBackend.calls if kind == "generations"
            for step, rows_ in [rest]]  # fmt: skip
    assert [step for step, _ in gens] == [e["step"] for e in evals]
    assert [row for _, rows_ in gens for row in rows_] == rows


def test_a_backend_that_fails_is_dropped_and_the_others_go_on(caplog):
    class Broken:
        def log_metrics(self, step, metrics, responses=None):
            raise OSError("disk full")

    class Good:
        seen = []

        def log_metrics(self, step, metrics, responses=None):
            self.seen.append(step)

    good = Good()
    tracker = tracking.Tracker({"broken": Broken(), "good": good})
    with caplog.at_level("WARNING"):
        tracker.log_record({"kind": "update", "step": 1, "loss": 0.5})
        tracker.log_record({"kind": "update", "step": 2, "loss": 0.4})
    assert good.seen == [1, 2] and list(tracker.backends) == ["good"]
    assert "'broken' failed (OSError: disk full)" in caplog.text


def test_scalars_keep_the_numbers_of_a_line_under_its_kind():
    record = {"kind": "eval", "step": 4, "eval_metric": "mean_at_k", "eval_accuracy": 0.25,
              "eval_k": 2, "flag": True, "none": None, "arr": np.float32(1.5)}  # fmt: skip
    assert tracking.scalars(record) == {  # eval/accuracy, not eval/eval_accuracy
        "eval/accuracy": 0.25,
        "eval/k": 2.0,
        "eval/flag": 1.0,
        "eval/arr": 1.5,
    }
    update = {"kind": "update", "step": 1, "update_tokens": 8, "loss": 0.5}
    assert tracking.scalars(update) == {"update/tokens": 8.0, "update/loss": 0.5}


def test_unknown_or_missing_backends_are_one_line_errors_at_resolve(monkeypatch, tmp_path):
    c = tiny_run_config(str(tmp_path), str(tmp_path / "run"), tracking="jsonl,tensorbord")
    with pytest.raises(ValueError) as e:
        config_lib.resolve(c)
    assert "\n" not in str(e.value)
    assert "tracking='jsonl,tensorbord': unknown backend 'tensorbord'" in str(e.value)
    monkeypatch.setitem(tracking.BACKENDS, "nothere", ("no_such_package_rl_batch", None))
    c.tracking = "nothere"
    with pytest.raises(ValueError, match="needs the package no_such_package_rl_batch, which is"):
        config_lib.resolve(c)
    assert tracking.config_errors(3) == ["tracking=3: expected a comma list of " + ", ".join(
        tracking.BACKENDS)]  # fmt: skip
    assert tracking.backend_names(" tensorboard, ,jsonl,tensorboard") == ["tensorboard", "jsonl"]


def _tfrecords(path):
    """The payloads of a TFRecord file (length, crc, data, crc)."""
    with open(path, "rb") as f:
        data = f.read()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i : i + 8])
        out.append(data[i + 12 : i + 12 + n])
        i += 12 + n + 4
    return out


def _events_of(path):
    from tensorboardX.proto import event_pb2

    return [event_pb2.Event.FromString(payload) for payload in _tfrecords(path)]


def _events(logdir):
    """The events of a logdir's own event files (subdirectories are runs of their own)."""
    events = []
    for name in sorted(os.listdir(logdir)):
        if os.path.isfile(os.path.join(logdir, name)):
            events.extend(_events_of(os.path.join(logdir, name)))
    return events


def test_tensorboard_writes_scalars_and_text_that_read_back(tmp_path):
    pytest.importorskip("tensorboardX")
    info = tracking.RunInfo(str(tmp_path), "run", {})
    tracker = tracking.make_tracker("jsonl,tensorboard", info)
    tracker.log_record({"kind": "update", "step": 1, "loss": 0.5, "eval_metric": "x"})
    tracker.log_record({"kind": "eval", "step": 1, "eval_accuracy": 0.125})
    tracker.log_record({"kind": "update", "step": 2, "loss": 0.25, "responses_cum": 32})
    tracker.log_record({"kind": "eval", "step": 2, "eval_accuracy": 0.5, "responses_cum": 32})
    rows = [{"prompt": "1+1=", "responses": ["2", "3"], "rewards": [1.0, 0.0]}]
    tracker.log_generations(1, rows)
    tracker.close()
    logdir = os.path.join(str(tmp_path), tracking.TENSORBOARD_DIR)
    events = _events(logdir)

    def simple(events):
        return [(e.step, v.tag, v.simple_value) for e in events for v in e.summary.value
                if v.HasField("simple_value")]  # fmt: skip

    assert simple(events) == [
        (1, "update/loss", 0.5),
        (1, "eval/accuracy", 0.125),
        (2, "update/loss", 0.25),
        (2, "update/responses_cum", 32.0),
        (2, "eval/accuracy", 0.5),
        (2, "eval/responses_cum", 32.0),
    ]
    # The same scalars stepped by cumulative retained responses, in a logdir of their own.
    by_responses = simple(_events(os.path.join(logdir, tracking.RESPONSES_KEY)))
    assert by_responses == [
        (32, "update/loss", 0.25),
        (32, "update/responses_cum", 32.0),
        (32, "eval/accuracy", 0.5),
        (32, "eval/responses_cum", 32.0),
    ]
    texts = [v.tensor.string_val[0].decode() for e in events for v in e.summary.value
             if v.HasField("tensor") and v.tag.startswith("generations")]  # fmt: skip
    assert texts == [tracking.generations_markdown(rows)]
    assert "| 1+1= | 3 | 0 |" in texts[0]


def test_tensorboard_resumed_at_a_checkpoint_purges_the_steps_after_it(tmp_path):
    pytest.importorskip("tensorboardX")
    tb = tracking.TensorBoard(tracking.RunInfo(str(tmp_path), "run", {}, resumed_step=3))
    tb.log_metrics(4, {"update/loss": 1.0}, responses=64)
    tb.log_metrics(5, {"update/loss": 0.5}, responses=80)
    tb.close()
    logdir = os.path.join(str(tmp_path), tracking.TENSORBOARD_DIR)
    events = [e for e in os.listdir(logdir) if e.startswith("events")]
    events = _events_of(os.path.join(logdir, events[0]))
    purge = [e for e in events if e.HasField("session_log")]
    assert purge[0].step == 4 and purge[0].session_log.status == purge[0].session_log.START
    # The responses-stepped copies are purged from the first redone line's responses on
    # (a purge at step 4 there would drop nearly the whole earlier curve).
    events = _events(os.path.join(logdir, tracking.RESPONSES_KEY))
    purge = [e for e in events if e.HasField("session_log")]
    assert [e.step for e in purge] == [64]


def test_wandb_runs_offline_and_a_resumed_run_continues_the_same_run(tmp_path, monkeypatch):
    inits, logs, defines = [], [], []

    class Run:
        def log(self, data, step):
            logs.append((step, data))

        def define_metric(self, name, step_metric=None):
            defines.append((name, step_metric))

        def finish(self):
            logs.append("finish")

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: inits.append(kw) or Run()
    fake.Table = lambda columns, data: ("table", tuple(columns), data)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert tracking.config_errors("wandb") == []
    info = tracking.RunInfo(str(tmp_path), "p16", {"seed": 0})
    tracker = tracking.make_tracker("wandb", info)
    tracker.log_record({"kind": "update", "step": 2, "loss": 0.5})
    tracker.log_generations(2, [{"prompt": "q", "responses": ["a"], "rewards": [1.0]}])
    tracker.close()
    tracking.make_tracker("wandb", info).close()
    # Responses are every chart's x-axis (steps stay selectable), declared each session.
    assert defines == [("responses", None), ("*", "responses")] * 2
    assert [kw["mode"] for kw in inits] == ["offline", "offline"]
    assert inits[0]["id"] == inits[1]["id"] and inits[0]["resume"] == "allow"
    assert inits[0]["dir"] == os.path.join(str(tmp_path), tracking.WANDB_DIR)
    assert inits[0]["name"] == "p16" and inits[0]["config"] == {"seed": 0}
    assert logs[:3] == [
        (2, {"update/loss": 0.5}),
        (2, {"generations": ("table", ("prompt", "response", "reward"), [["q", "a", 1.0]])}),
        "finish",
    ]


def _wandb_records(path):
    """The records of a W&B run file, read by the importer's reader (the wandb package's
    own protobufs)."""
    from rl_batch.analysis.importers.sources import wandb_records

    return list(wandb_records(path))


def _key(item):
    return item.key or "/".join(item.nested_key)


def test_real_wandb_offline_run_directory_holds_the_logged_values(tmp_path, monkeypatch):
    """The wandb package itself (offline): a run directory whose run file holds the
    metrics, name, group and config we logged; a resumed run writes to the same run id."""
    import glob

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = str(tmp_path / "sweeps" / "demo" / "runs" / "p16_s0")
    os.makedirs(run_dir)
    artifacts.write_json_atomic(str(tmp_path / "sweeps" / "demo" / artifacts.SWEEP_FILE), {})
    info = tracking.RunInfo(run_dir, "p16_s0", {"seed": 3, "lr": 1e-5})
    tracker = tracking.make_tracker("wandb", info)
    tracker.log_record({"kind": "update", "step": 2, "loss": 0.5, "responses_cum": 32})
    tracker.log_record({"kind": "eval", "step": 2, "eval_accuracy": 0.25, "responses_cum": 32})
    tracker.close()
    tracking.make_tracker("wandb", info).close()  # resumed

    runs = sorted(glob.glob(os.path.join(run_dir, tracking.WANDB_DIR, "wandb", "offline-run-*")))
    assert len(runs) == 2, runs
    with open(os.path.join(run_dir, tracking.WANDB_ID_FILE)) as f:
        run_id = f.read().strip()
    # (wandb adds "-1" to the second directory's name when both start in the same second)
    assert all(re.search(rf"-{run_id}(-\d+)?$", r) for r in runs), runs
    records = _wandb_records(os.path.join(runs[0], f"run-{run_id}.wandb"))
    history = [  # (a key with "/" is stored as its parts)
        {k: item.value_json for item in r.history.item if not (k := _key(item)).startswith("_")}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    assert history == [
        {
            "update/loss": "0.5",
            "update/responses_cum": "32",
            "eval/accuracy": "0.25",
            "eval/responses_cum": "32",
            "responses": "32",
        }
    ], history
    # The responses axis is declared to W&B (define_metric) as every metric's step.
    metrics = [r.metric for r in records if r.WhichOneof("record_type") == "metric"]
    assert any(m.glob_name == "*" and m.step_metric == "responses" for m in metrics), metrics
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.run_id, run.display_name, run.run_group) == (run_id, "p16_s0", "demo")
    config = {_key(item): item.value_json for item in run.config.update}
    assert config["seed"] == "3" and float(config["lr"]) == 1e-5


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_training_samples_every_n_updates_go_to_generations_jsonl_and_the_dashboards(
    work_dir, tmp_path, fake_backend
):
    c = tiny_run_config(
        work_dir,
        str(tmp_path / "run"),
        budget_responses=64,  # 4 updates; validations at 0, 2 and 4
        tracking="jsonl,fake",
        log_generations=3,
        log_generations_every=2,
    )
    run_lib.run(c, progress=False)
    rows = list(artifacts.iter_jsonl(os.path.join(c.run_dir, artifacts.GENERATIONS_FILE)))
    train = [r for r in rows if r["source"] == "train"]
    val = [r for r in rows if r["source"] == "validation"]
    assert all(r["kind"] == "generation" for r in rows)
    assert [r["step"] for r in train] == [2, 2, 2, 4, 4, 4]  # 3 prompts every 2 updates
    assert sorted({r["step"] for r in val}) == [0, 2, 4]
    updates = {r["step"]: r for r in artifacts.read_metrics(c.run_dir, "update")}
    task = config_lib.make_task(c)
    max_new_tokens = config_lib.resolve(c, device_count=1).max_new_tokens
    for r in train:
        assert len(r["responses"]) == len(r["rewards"]) == len(r["lengths"]) == c.group_size
        assert r["responses_cum"] == updates[r["step"]]["responses_cum"]
        example = {"prompt": r["prompt"], "answer": r["answer"]}
        assert r["rewards"] == [task.reward(example, x) for x in r["responses"]]
        # Generated tokens: at least one per character of the text (a random policy also
        # samples specials that decode to nothing, and the EOS), at most max_new_tokens.
        for text, n in zip(r["responses"], r["lengths"]):
            assert 1 <= n <= max_new_tokens and len(text) <= n
    sent = [rows_ for kind, *rest in FakeBackend.calls if kind == "generations"
            for _, rows_ in [rest]]  # fmt: skip
    assert [row for rows_ in sent for row in rows_] == rows
    assert {tracking.generations_key(rows_) for rows_ in sent} == {
        "generations",
        "train_generations",
    }
    markdown = tracking.generations_markdown(train[:1])
    assert markdown.splitlines()[0] == "| prompt | response | reward | length |"


def test_log_generations_every_must_be_a_count(tmp_path):
    c = tiny_run_config(str(tmp_path), str(tmp_path / "run"), log_generations_every=-1)
    with pytest.raises(ValueError, match=r"log_generations_every=-1: must be an int >= 0") as e:
        config_lib.resolve(c, device_count=1)
    assert "\n" not in str(e.value)


def _texts(logdir, tag):
    return [(e.step, v.tensor.string_val[0].decode()) for e in _events(logdir)
            for v in e.summary.value if v.HasField("tensor") and v.tag.startswith(tag)]  # fmt: skip


def _sweep_run_dir(tmp_path, name="p16", marker="sweep.json"):
    run_dir = tmp_path / "my_sweep" / artifacts.RUNS_DIR / name
    run_dir.mkdir(parents=True)
    where = run_dir if marker == "sweep_point.json" else tmp_path / "my_sweep"
    (where / marker).write_text("{}")
    return str(run_dir)


def test_a_sweeps_runs_share_a_wandb_group_and_a_tensorboard_logdir(tmp_path, monkeypatch):
    pytest.importorskip("tensorboardX")
    inits = []

    class Run:
        def log(self, data, step):
            pass

        def define_metric(self, name, step_metric=None):
            pass

        def finish(self):
            pass

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: inits.append(kw) or Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    config = {"seed": 0, "prompts": 16, "task": {"name": "addition"}}
    a = _sweep_run_dir(tmp_path, "p16")
    b = _sweep_run_dir(tmp_path, "p32")
    lone = str(tmp_path / "runs" / "p64")  # under a "runs" folder that is no sweep's
    only = _sweep_run_dir(tmp_path / "job", "p8", marker="sweep_point.json")
    for run_dir in (a, b, lone, only):
        tracking.make_tracker("tensorboard,wandb", tracking.RunInfo(run_dir, "x", config)).close()
    assert [kw["group"] for kw in inits] == ["my_sweep", "my_sweep", None, "my_sweep"]
    assert all(kw["config"] == config for kw in inits)
    # tensorboard --logdir=<sweep_dir> finds each run's event files below it.
    sweep_dir = os.path.join(str(tmp_path), "my_sweep")
    found = sorted(os.path.relpath(d, sweep_dir) for d, _, files in os.walk(sweep_dir)
                   if any(f.startswith("events.out.tfevents") for f in files))  # fmt: skip
    assert found == [os.path.join("runs", n, tracking.TENSORBOARD_DIR) for n in ("p16", "p32")]
    # The resolved config as text, once: a resumed session does not write it again.
    logdir = os.path.join(a, tracking.TENSORBOARD_DIR)
    assert _texts(logdir, "config") == [(0, tracking.config_markdown(config))]
    resumed = str(tmp_path / "resumed")
    tracking.TensorBoard(tracking.RunInfo(resumed, "x", config, resumed_step=3)).close()
    assert _texts(os.path.join(resumed, tracking.TENSORBOARD_DIR), "config") == []
    assert '"prompts": 16' in tracking.config_markdown(config)
