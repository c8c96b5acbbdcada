"""--resume compares a run's settings as values: what run.json recorded (JSON lists) and what the
same command line gives again (tuples, after the config's own parsing) are the same run, for every
list-valued setting of every preset (issue 58: a LoRA run could not resume from the CLI)."""

from __future__ import annotations

import json

import pytest

from mopd.config import resolve
from mopd.config.registries import preset_names
from mopd.train.run_dir import flatten, identity_differences, identity_dict


def recorded(ident: dict) -> dict:
    return json.loads(json.dumps(ident, default=str))   # as run.json holds it


@pytest.mark.parametrize("lora", [0, 8])
def test_every_list_valued_setting_compares_equal_to_what_was_recorded(lora):
    seen_lists = set()
    for name in preset_names():
        cfg = resolve(name, [f"model.lora.rank={lora}", "model.lora.target_modules=[q_proj,v_proj]",
                             "reward.kl_roles=[leader,answerer]"])
        conf = flatten(identity_dict(cfg))
        seen_lists |= {k for k, v in conf.items() if isinstance(v, (list, tuple))}
        ident = {"config": conf}
        assert identity_differences(recorded(ident), ident) == ({}, {}), name
    assert "reward.kl_roles" in seen_lists and (lora == 0 or "model.lora.target_modules" in seen_lists)


def test_a_changed_list_is_still_a_change():
    ident = {"config": flatten(identity_dict(resolve("cmas_rl", ["model.lora.rank=8"])))}
    other = {"config": flatten(identity_dict(resolve("cmas_rl", ["model.lora.rank=8",
                                                                  "model.lora.target_modules=[q_proj]"])))}
    refused, _ = identity_differences(recorded(ident), other)
    assert list(refused) == ["model.lora.target_modules"]
