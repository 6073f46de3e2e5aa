"""The shipped base policies (``experiments/configs/base_policies``): each was trained with
its study config's data, model and pretrain settings, loads into that model, and scores
on the validation split, rebuilt here from the task's generator, the p_ref its record
gives (so data, model and file agree on this machine)."""

import importlib
import json
import os

import pytest

from rl_batch.runs import config as config_lib
from rl_batch.runs import pretrain

STUDIES = ["grpo_cpu", "ppo_cpu"]


@pytest.mark.slow  # 9 s in the fast tier at b3308b3 (2 cores, load 2-5)
@pytest.mark.parametrize("study", STUDIES)
def test_shipped_base_policy_is_the_configs_own_and_scores_its_recorded_p_ref(tmp_path, study):
    c = importlib.import_module(f"experiments.configs.{study}").get_config()
    del c["sweep"]
    c.work_dir = str(tmp_path)
    assert c.init.source == "params", "the study should start from its shipped base policy"
    path = c.init.path
    with open(os.path.splitext(path)[0] + ".json") as f:
        record = json.load(f)
    spec = config_lib.resolve(c)
    c, model_config = spec.config, spec.model
    # The settings that made it are the config's (the data it was trained and scored on,
    # the model, the pretraining); fields added to the task later do not matter.
    made_with = {k: record["task"][k] for k in ("name", "kwargs", "n_train", "n_validation")}
    assert made_with == {k: c.task[k].to_dict() if k == "kwargs" else c.task[k] for k in made_with}
    assert record["model"] == json.loads(json.dumps(model_config.to_dict()))  # (as JSON)
    assert record["pretrain"] == c.pretrain.to_dict()

    params = pretrain.load_params_file(path, model_config)
    _, val = pretrain.base_splits(c, config_lib.make_task(c))
    scorer = pretrain.stop_scorer(c, model_config, config_lib.make_tokenizer(c), val)
    _, _, recorded = record["evals"][-1]
    assert scorer(params)["eval_p_ref"] == pytest.approx(recorded, abs=1e-4)
