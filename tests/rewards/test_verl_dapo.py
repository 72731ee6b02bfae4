"""The dapo reward manager's overlong penalty against upstream verl 0.9.1's own `DAPORewardManager` (issue 23).

verl runs in its side venv (VERL_SIDE_PYTHON, built by tests/verl_side.sh) as a subprocess: the script below
builds a `DataProto` of 2-token prompts and responses of the given valid lengths (a reward function that
returns 1.0 for every response, a tokenizer stub that decodes to ""), calls verl's manager with
`max_resp_len` and `overlong_buffer_cfg`, and prints each row's summed reward and the reward extras.
verl-npu's `dapo_scores` must give the same numbers.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from run_helpers import verl_side_python

from verl_npu.rewards.dapo import dapo_scores

pytestmark = pytest.mark.verl_side
VERL_PY = verl_side_python()

SCRIPT = r"""
import json, sys
import numpy as np, torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.workers.reward_manager.dapo import DAPORewardManager

args = json.loads(sys.argv[1])
lengths, width = args["lengths"], args["max_resp_len"]
n = len(lengths)
responses = torch.ones(n, width, dtype=torch.long)
attention = torch.cat([torch.ones(n, 2, dtype=torch.long),
                       (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()], dim=1)
data = DataProto.from_dict(
    tensors={"prompts": torch.ones(n, 2, dtype=torch.long), "responses": responses, "attention_mask": attention},
    non_tensors={"reward_model": np.array([{"ground_truth": "1"}] * n, dtype=object),
                 "data_source": np.array(["x"] * n, dtype=object),
                 "extra_info": np.array([{} for _ in range(n)], dtype=object)})

class Tok:
    eos_token = "</s>"
    def decode(self, ids, skip_special_tokens=True):
        return ""

manager = DAPORewardManager(Tok(), 0, compute_score=lambda **kw: args["score"], max_resp_len=width,
                            overlong_buffer_cfg=OmegaConf.create(args["cfg"]))
out = manager(data, return_dict=True)
print(json.dumps({"scores": out["reward_tensor"].sum(-1).tolist(),
                  "extras": {k: [float(v) for v in vals] for k, vals in out["reward_extra_info"].items()}}))
"""


@pytest.mark.parametrize("buffer_len,factor", [(4, 1.0), (3, 0.5), (10, 2.0)])
def test_overlong_penalty_matches_verl(buffer_len, factor):
    lengths, max_resp_len, score = [1, 5, 6, 7, 8, 9, 10], 10, 1.0
    cfg = {"enable": True, "len": buffer_len, "penalty_factor": factor, "log": True}
    proc = subprocess.run(
        [
            VERL_PY,
            "-c",
            SCRIPT,
            json.dumps({"lengths": lengths, "max_resp_len": max_resp_len, "score": score, "cfg": cfg}),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    verl = json.loads(proc.stdout.strip().splitlines()[-1])
    scores, extras = dapo_scores(
        [score] * len(lengths),
        {},
        lengths,
        {"max_resp_len": max_resp_len, "overlong_buffer_cfg": cfg},
        max_response_length=99,
    )
    assert scores == pytest.approx(verl["scores"], abs=1e-6)
    for name in ("acc", "overlong_reward", "overlong"):
        assert extras[name] == pytest.approx(verl["extras"][name], abs=1e-6), name
