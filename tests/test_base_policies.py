"""The shipped base policies (``experiments/configs/base_policies``): each is the one its
study's config would train (same cache key), loads into that config's model, and scores
on the validation split, rebuilt here from the task's generator, the p_ref its record
gives (so data, model and file agree on this machine)."""

import importlib
import json
import os

import pytest

from rl_batch import config as config_lib
from rl_batch import exact_eval, pretrain
from rl_batch.tasks.tfds_builders import load_split

STUDIES = ["grpo_cpu"]


@pytest.mark.parametrize("study", STUDIES)
def test_shipped_base_policy_is_the_configs_own_and_scores_its_recorded_p_ref(tmp_path, study):
    c = importlib.import_module(f"experiments.configs.{study}").get_config()
    del c["sweep"]
    c.work_dir = str(tmp_path)
    assert c.init.source == "params", "the study should start from its shipped base policy"
    path = c.init.path
    with open(os.path.splitext(path)[0] + ".json") as f:
        record = json.load(f)
    c = config_lib.resolve(c)
    trained = c.copy_and_resolve_references()
    trained.init.source = "pretrain"
    assert record["key"] == pretrain.cache_key(trained), (
        f"{path} was trained with other task/model/pretrain settings than {study}.py: "
        "re-export it (see experiments/pretrain.py)"
    )

    model_config = config_lib.make_model_config(c)
    params = pretrain.load_params_file(path, model_config)
    kwargs = dict(c.task.kwargs.to_dict(), n_train=c.task.n_train, n_validation=c.task.n_validation)
    val = load_split(c.task.name, "validation", str(tmp_path / "data"), **kwargs)
    scorer = exact_eval.ReferenceScorer(
        model_config,
        config_lib.make_tokenizer(c),
        val.get_batch(range(len(val))),
        temperature=c.sampling.temperature,
    )
    _, _, recorded = record["evals"][-1]
    assert scorer(params)["eval_p_ref"] == pytest.approx(recorded, abs=1e-4)
