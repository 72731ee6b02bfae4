"""PPO with a critic: GAE and the clipped value loss on fixed inputs (numbers worked out by hand
from the formulas in shared/reference/verl-facts.md), the role registry, and tiny CPU runs."""

from __future__ import annotations

import statistics

import pytest
import torch

from verl_npu import algorithms as A
from verl_npu.config.typed import section


def test_gae_matches_hand_computed_numbers():
    # gamma 0.9, lam 0.8 (gamma*lam = 0.72); row 2 has a padded last position
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 0.4], [0.1, 0.3, 0.7]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = A.compute_advantages(
        "gae",
        token_level_rewards=rewards,
        response_mask=mask,
        config=section("algorithm", {"gamma": 0.9, "lam": 0.8}),
        values=values,
    )
    # row 1: t=2: delta = 1 - 0.4 = 0.6 -> A=0.6; t=1: delta = 0.9*0.4 - 0.2 = 0.16, A = 0.16 + 0.72*0.6 = 0.592;
    #        t=0: delta = 0.9*0.2 - 0.5 = -0.32, A = -0.32 + 0.72*0.592 = 0.10624
    # row 2: t=2 padding: state stays (0, 0), A=0; t=1: delta = 2 - 0.3 = 1.7 -> A=1.7;
    #        t=0: delta = 0.9*0.3 - 0.1 = 0.17, A = 0.17 + 0.72*1.7 = 1.394
    raw = [[0.10624, 0.592, 0.6], [1.394, 1.7, 0.0]]
    expected_returns = [[0.60624, 0.792, 1.0], [1.494, 2.0, 0.7]]
    assert torch.allclose(ret, torch.tensor(expected_returns), atol=1e-6)
    masked = [0.10624, 0.592, 0.6, 1.394, 1.7]
    mean, var = statistics.mean(masked), statistics.variance(masked)  # unbiased, as masked_whiten
    for i in range(2):
        for t in range(3):
            if mask[i, t]:
                assert adv[i, t].item() == pytest.approx((raw[i][t] - mean) / (var + 1e-8) ** 0.5, abs=1e-5)


def test_gae_with_gamma_and_lam_one_is_return_minus_value():
    rewards = torch.tensor([[1.0, 0.0, 2.0]])
    values = torch.tensor([[0.3, -0.2, 0.5]])
    mask = torch.ones(1, 3)
    _, ret = A.compute_advantages(
        "gae",
        token_level_rewards=rewards,
        response_mask=mask,
        config=section("algorithm", {"gamma": 1.0, "lam": 1.0}),
        values=values,
    )
    # lam = gamma = 1: A_t = sum of rewards from t on - V_t, so returns = reward-to-go = [3, 2, 2]
    assert ret[0].tolist() == pytest.approx([3.0, 2.0, 2.0])


def test_gae_without_values_is_an_error():
    with pytest.raises(ValueError, match="values"):
        A.compute_advantages(
            "gae", token_level_rewards=torch.zeros(1, 2), response_mask=torch.ones(1, 2), config=section("algorithm")
        )


def test_clipped_value_loss_matches_hand_computed_numbers():
    vpreds = torch.tensor([[1.0, 2.0, 5.0]])
    old = torch.tensor([[0.5, 0.5, 0.0]])
    returns = torch.tensor([[1.2, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
    # clip range 0.2 around 0.5: V_clip = 0.7 for both tokens
    # token 1: (1.0-1.2)^2 = 0.04, (0.7-1.2)^2 = 0.25 -> 0.25 (clipped branch wins)
    # token 2: (2.0-0.0)^2 = 4.0,  (0.7-0.0)^2 = 0.49 -> 4.0
    out = A.clipped_value_loss(vpreds, old, returns, mask, 0.2, "token-mean")
    assert out["vf_loss"].item() == pytest.approx(0.5 * (0.25 + 4.0) / 2)
    assert out["vf_clipfrac"].item() == pytest.approx(0.5)
    out = A.clipped_value_loss(vpreds, old, returns, mask, 0.2, "token-sum")
    assert out["vf_loss"].item() == pytest.approx(0.5 * 4.25)
    # a wide clip range never clips: plain 0.5 * mean squared error
    out = A.clipped_value_loss(vpreds, old, returns, mask, 10.0, "token-mean")
    assert out["vf_loss"].item() == pytest.approx(0.5 * (0.04 + 4.0) / 2)
    assert out["vf_clipfrac"].item() == 0.0


def test_policy_loss_is_looked_up_by_loss_mode():
    from verl_npu.config.schema import SCHEMA
    from verl_npu.registry import POLICY_LOSSES

    assert set(A.POLICY_LOSSES) == set(POLICY_LOSSES.specs)
    assert SCHEMA["backend_config.actor_rollout_ref.actor.policy_loss.loss_mode"].choices == tuple(POLICY_LOSSES.specs)
    assert A.policy_loss_fn("vanilla") is A.ppo_policy_loss
    with pytest.raises(KeyError, match="vanilla"):
        A.policy_loss_fn("no_such_loss")


def test_roles_follow_the_config():
    from omegaconf import OmegaConf

    from verl_npu.registry import ROLES
    from verl_npu.workers.roles import roles_for

    def cfg(est, enable=None):
        return OmegaConf.create({"algorithm": {"adv_estimator": est}, "critic": {"enable": enable}})

    assert roles_for(cfg("grpo")) == ["actor"]
    assert roles_for(cfg("gae")) == ["actor", "critic"]
    assert roles_for(cfg("grpo", True)) == ["actor", "critic"]
    assert ROLES.load("critic").__name__ == "CriticWorker"


# ---- tiny CPU runs: PPO with a GAE critic -----------------------------------------------------------
CRITIC_METRICS = [
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
    "critic/grad_norm",
    "critic/lr",
    "critic/values/mean",
    "critic/values/max",
    "critic/values/min",
    "critic/advantages/mean",
    "critic/returns/mean",
]
COMPARED = [
    "critic/score/mean",
    "response_length/mean",
    "critic/vf_loss",
    "critic/vpred_mean",
    "critic/grad_norm",
    "critic/values/mean",
    "critic/returns/mean",
    "actor/pg_loss",
    "actor/grad_norm",
]


def ppo_overrides(out, data, gpus: int = 1, **extra) -> list[str]:
    """The text run of run_helpers.text_run_overrides with GAE and a critic, 3 steps, a checkpoint after each."""
    from run_helpers import text_run_overrides

    return text_run_overrides(
        out,
        data,
        **{
            "data.max_response_length": 3,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
            "algorithm.adv_estimator": "gae",
            "algorithm.gamma": 1.0,
            "algorithm.lam": 0.95,
            "critic.optim.lr": 1e-3,
            "critic.ppo_micro_batch_size_per_gpu": 2,
            "critic.cliprange_value": 0.5,
            "trainer.n_gpus_per_node": gpus,
            "trainer.total_training_steps": 3,
            "trainer.save_freq": 1,
            "ray_init.num_cpus": 2,
            **extra,
        },
    )


@pytest.fixture(scope="module")
def ppo_data(tmp_path_factory):
    from run_helpers import text_data

    return text_data(tmp_path_factory.mktemp("ppo_data"))


@pytest.fixture(scope="module")
def ppo_reference(tmp_path_factory, ppo_data, tiny_lm_path):
    """An uninterrupted 3-step PPO run (critic_warmup=1), a checkpoint at every step."""
    from verl_npu.config import load_recipe
    from verl_npu.trainer.entry import run_training

    out = tmp_path_factory.mktemp("ppo_reference") / "out"
    assert run_training(load_recipe("tiny_geo3k", ppo_overrides(out, ppo_data, **{"trainer.critic_warmup": 1}))) == 0
    return out


@pytest.mark.slow
def test_ppo_with_a_critic_trains_and_checkpoints_both_roles(ppo_reference):
    from run_helpers import step_metrics

    rows = step_metrics(ppo_reference)
    assert sorted(rows) == [1, 2, 3]
    for step, row in rows.items():
        missing = [k for k in CRITIC_METRICS if k not in row]
        assert not missing, (step, missing)
        assert 0 <= row["critic/vf_loss"] < 1e6 and row["critic/grad_norm"] > 0
    assert "actor/pg_loss" not in rows[1]  # critic_warmup=1: step 1 trains only the critic
    assert "actor/pg_loss" in rows[2] and rows[2]["actor/grad_norm"] > 0
    # the critic learns: its values move between steps
    assert rows[1]["critic/values/mean"] != rows[3]["critic/values/mean"]
    step = ppo_reference / "checkpoints" / "global_step_3"
    for role in ("actor", "critic"):
        names = {p.name for p in (step / role).iterdir()}
        assert {
            "model_world_size_1_rank_0.pt",
            "optim_world_size_1_rank_0.pt",
            "extra_state_world_size_1_rank_0.pt",
            "fsdp_config.json",
            "huggingface",
        } <= names, (role, names)
    from safetensors.torch import load_file

    critic = load_file(str(step / "critic" / "huggingface" / "model.safetensors"))
    assert critic["score.weight"].shape[0] == 1  # the value head: hidden -> one value


@pytest.mark.slow
def test_ppo_run_killed_after_a_checkpoint_resumes_actor_and_critic_exactly(
    tmp_path, ppo_reference, ppo_data, tiny_cache
):
    """SIGKILL once global_step_2 is complete; the rerun resumes both roles from it and trains step 3
    exactly as the uninterrupted run did."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from run_helpers import step_metrics, wait_for_checkpoint

    out = tmp_path / "out"
    args = ppo_overrides(out, ppo_data, **{"trainer.critic_warmup": 1})
    env = dict(os.environ, VERL_NPU_CACHE=str(tiny_cache), OMP_NUM_THREADS="1")
    repo = Path(__file__).resolve().parents[2]

    def cli():
        return subprocess.Popen(
            [sys.executable, "-m", "verl_npu.cli", "run", "tiny_geo3k", *args],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    proc = cli()
    marker = out / "checkpoints" / "latest_checkpointed_iteration.txt"
    if wait_for_checkpoint(proc, marker, 2):
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stdout.read()
    resumed = cli()
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    assert "resumed from" in output and "global_step_2" in output
    got, ref = step_metrics(out), step_metrics(ppo_reference)
    assert sorted(got) == [1, 2, 3]
    for key in COMPARED:
        assert got[3][key] == pytest.approx(ref[3][key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow
def test_max_critic_ckpt_to_keep_removes_old_steps(tmp_path, ppo_data, tiny_lm_path):
    from verl_npu.config import load_recipe
    from verl_npu.trainer.entry import run_training

    out = tmp_path / "out"
    over = ppo_overrides(out, ppo_data, **{"trainer.total_training_steps": 2, "trainer.max_critic_ckpt_to_keep": 1})
    assert run_training(load_recipe("tiny_geo3k", over)) == 0
    assert sorted(p.name for p in (out / "checkpoints").glob("global_step_*")) == ["global_step_2"]


@pytest.mark.slow
def test_two_workers_train_the_critic_like_one(tmp_path, ppo_data, tiny_lm_path):
    from run_helpers import step_metrics

    from verl_npu.config import load_recipe
    from verl_npu.trainer.entry import run_training

    one, two = tmp_path / "one", tmp_path / "two"
    extra = {"trainer.total_training_steps": 2, "trainer.save_freq": -1}
    assert run_training(load_recipe("tiny_geo3k", ppo_overrides(one, ppo_data, 1, **extra))) == 0
    assert run_training(load_recipe("tiny_geo3k", ppo_overrides(two, ppo_data, 2, **extra))) == 0
    m1, m2 = step_metrics(one), step_metrics(two)
    assert sorted(m1) == sorted(m2) == [1, 2]
    for step in m1:
        for key in COMPARED:
            assert m2[step][key] == pytest.approx(m1[step][key], rel=1e-4, abs=1e-5), (step, key)


@pytest.mark.slow
def test_resuming_a_checkpoint_without_critic_folder_names_it(tmp_path, ppo_reference, ppo_data):
    import shutil

    from verl_npu.config import load_recipe
    from verl_npu.errors import UserError
    from verl_npu.trainer.entry import run_training

    out = tmp_path / "out"
    shutil.copytree(ppo_reference, out)
    from verl_npu.trainer.checkpoint import write_manifest

    # a complete checkpoint of a run without a critic (its manifest lists no critic files)
    shutil.rmtree(out / "checkpoints" / "global_step_3" / "critic")
    write_manifest(out / "checkpoints" / "global_step_3", 3)
    over = ppo_overrides(
        out,
        ppo_data,
        **{
            "trainer.resume_mode": "resume_path",
            "trainer.resume_from_path": out / "checkpoints" / "global_step_3",
            "trainer.total_training_steps": 4,
        },
    )
    with pytest.raises(UserError, match="has no critic/ folder"):
        run_training(load_recipe("tiny_geo3k", over))
