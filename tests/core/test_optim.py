"""verl_npu.optim: AdamW settings, LR schedule values at chosen steps, scheduler resume (the inputs: typed
`actor_rollout_ref.actor.optim` sections, the keys not given at the schema's defaults)."""

import math

import pytest
import torch

from verl_npu.config.typed import section
from verl_npu.errors import UserError
from verl_npu.optim import build_lr_scheduler, build_optimizer, warmup_steps


def optim(**values):
    return section("actor_rollout_ref.actor.optim", values)


def make(cfg, total):
    model = torch.nn.Linear(2, 1)
    optimizer = build_optimizer(model.parameters(), cfg)
    return model, optimizer, build_lr_scheduler(optimizer, cfg, total)


def lrs(cfg, total, steps):
    """LR seen by the optimizer before each of `steps` optimizer steps."""
    _, optimizer, scheduler = make(cfg, total)
    seen = []
    for _ in range(steps):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return seen


def test_build_optimizer_reads_lr_weight_decay_betas():
    cfg = optim(lr=3e-4, weight_decay=0.05, betas=[0.8, 0.95])
    _, optimizer, _ = make(cfg, 10)
    assert isinstance(optimizer, torch.optim.AdamW)
    group = optimizer.param_groups[0]
    assert group["lr"] == 3e-4 and group["weight_decay"] == 0.05 and group["betas"] == (0.8, 0.95)


def test_build_optimizer_rejects_bad_betas():
    with pytest.raises(UserError, match="optim.betas"):
        build_optimizer(torch.nn.Linear(1, 1).parameters(), optim(lr=1e-3, betas=[0.9]))


def test_constant_with_warmup_steps():
    seen = lrs(optim(lr=1.0, lr_warmup_steps=4, warmup_style="constant"), total=10, steps=7)
    assert seen == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_warmup_ratio_used_when_steps_not_positive():
    cfg = optim(lr=2.0, lr_warmup_steps=-1, lr_warmup_steps_ratio=0.25)
    assert warmup_steps(cfg, 10) == 2  # int(2.5)
    assert lrs(cfg, total=10, steps=4) == pytest.approx([0.0, 1.0, 2.0, 2.0])
    assert warmup_steps(optim(lr_warmup_steps=3, lr_warmup_steps_ratio=0.5), 10) == 3


def test_no_warmup_starts_at_full_lr():
    assert lrs(optim(lr=0.5), total=5, steps=2) == pytest.approx([0.5, 0.5])


def test_cosine_with_warmup_and_min_lr_ratio():
    cfg = optim(lr=1.0, lr_warmup_steps=2, warmup_style="cosine", min_lr_ratio=0.1, num_cycles=0.5)
    seen = lrs(cfg, total=10, steps=11)

    def cosine(step):
        progress = (step - 2) / 8
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    assert seen[:3] == pytest.approx([0.0, 0.5, 1.0])
    assert seen[6] == pytest.approx(cosine(6))  # halfway: 0.1 + 0.45 = 0.55
    assert seen[6] == pytest.approx(0.55)
    assert seen[10] == pytest.approx(0.1)  # the floor min_lr_ratio * lr at the last step
    assert all(a >= b for a, b in zip(seen[2:], seen[3:]))  # decays monotonically


def test_cosine_full_cycle_returns_up_and_min_lr_null_means_zero():
    # verl's null min_lr_ratio: the config layer refuses null for this key, so the section holds the default 0
    cfg = optim(lr=1.0, warmup_style="cosine", num_cycles=1.0)
    seen = lrs(cfg, total=4, steps=5)
    assert seen == pytest.approx([1.0, 0.5, 0.0, 0.5, 1.0], abs=1e-9)


def test_lr_scheduler_type_alias_and_bad_style():
    # verl's lr_scheduler_type arrives as warmup_style (the config loader's alias, tests/config/test_config_compat.py)
    seen = lrs(optim(lr=1.0, warmup_style="cosine"), total=2, steps=3)
    assert seen == pytest.approx([1.0, 0.5, 0.0], abs=1e-9)
    with pytest.raises(UserError, match="warmup_style"):
        make(optim(lr=1.0, warmup_style="linear"), 10)
    with pytest.raises(UserError, match="total_training_steps"):
        make(optim(lr=1.0), 0)


def test_errors_name_the_roles_own_optim_section():
    critic = section("critic.optim", {"lr": 1.0, "warmup_style": "linear"})
    with pytest.raises(UserError, match=r"^critic\.optim\.warmup_style"):
        make(critic, 10)
    with pytest.raises(UserError, match=r"^critic\.optim\.lr:"):
        make(section("critic.optim", {"lr": -1.0}), 10)
    with pytest.raises(UserError, match=r"^actor_rollout_ref\.actor\.optim\.lr:"):
        make(optim(lr=-1.0), 10)


def test_scheduler_resume_round_trips_through_state_dict():
    cfg = optim(lr=1.0, lr_warmup_steps=3, warmup_style="cosine", min_lr_ratio=0.0)
    reference = lrs(cfg, total=12, steps=12)

    model, optimizer, scheduler = make(cfg, 12)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    saved_opt, saved_sched = optimizer.state_dict(), scheduler.state_dict()

    # a fresh process: new model, optimizer and scheduler, then load the saved states
    _, optimizer2, scheduler2 = make(cfg, 12)
    optimizer2.load_state_dict(saved_opt)
    scheduler2.load_state_dict(saved_sched)
    resumed = []
    for _ in range(7):
        resumed.append(optimizer2.param_groups[0]["lr"])
        optimizer2.step()
        scheduler2.step()
    assert resumed == pytest.approx(reference[5:])
    assert scheduler2.last_epoch == 12


def test_zero_indexed_step_false_reads_the_cosine_one_step_further():
    """verl 0.9.1's optim.zero_indexed_step: false counts cosine steps from 1 (warmup included); the
    constant schedule ignores it, as in verl."""
    base = dict(lr=1.0, warmup_style="cosine", lr_warmup_steps=2, min_lr_ratio=0.1)
    zero = lrs(optim(**base), 8, 7)
    one = lrs(optim(**base, zero_indexed_step=False), 8, 6)
    assert one == pytest.approx(zero[1:])
    const = dict(lr=1.0, warmup_style="constant", lr_warmup_steps=2)
    assert lrs(optim(**const, zero_indexed_step=False), 8, 4) == lrs(optim(**const), 8, 4)
