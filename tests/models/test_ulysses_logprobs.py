"""`response_log_probs` with Ulysses SP=2 (2 gloo processes) equals SP=1, for a text and a VL model (log-probs,
entropies, gradients, and the sum of squared probabilities of actor.calculate_sum_pi_squared)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from gloo_workers import gloo_group, spawn_gloo


def _worker(rank: int, world: int, port: int, path: str, result_dir: str) -> None:
    with gloo_group(rank, world, port, wait_for_peers=True):
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        from verl_npu.models.forward import response_log_probs

        data = torch.load(os.path.join(result_dir, "inputs.pt"), weights_only=False)
        cls = AutoModelForImageTextToText if data["vision"] else AutoModelForCausalLM
        model = cls.from_pretrained(path, dtype=torch.float32)
        kwargs = dict(multi_modal_inputs=data["mm"], remove_padding=True, with_entropy=True, fused=data["fused"])
        lp, ent = response_log_probs(model, data["ids"], data["mask"], data["R"], sp_group=dist.group.WORLD, **kwargs)
        (lp * data["weights"]).sum().backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        with torch.no_grad():  # the old-log-prob pass of the optimal token baseline (actor.calculate_sum_pi_squared)
            spsq = response_log_probs(
                model,
                data["ids"],
                data["mask"],
                data["R"],
                sp_group=dist.group.WORLD,
                with_sum_pi_squared=True,
                **kwargs,
            )[2]
        for g in grads.values():  # FSDP would average over the 2 SP peers; grad_scale=P makes that the sum / P * P
            dist.all_reduce(g)
            g /= world
        if rank == 0:
            torch.save(
                {"lp": lp.detach(), "ent": ent.detach(), "grads": grads, "spsq": spsq},
                os.path.join(result_dir, "sp.pt"),
            )


def _inputs(path: str, vision: bool):
    from PIL import Image
    from transformers import AutoProcessor, AutoTokenizer

    texts = ["a short prompt", "a much longer prompt with more words", "mid size prompt"]
    if vision:
        proc = AutoProcessor.from_pretrained(path)
        proc.tokenizer.padding_side = "left"
        images = [Image.new("RGB", (56, 56), c) for c in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]]
        chats = [
            proc.apply_chat_template(
                [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t}]}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for t in texts
        ]
        enc = proc(text=chats, images=images, return_tensors="pt", padding=True)
        mm = [
            {
                k: v
                for k, v in proc(text=[c], images=[i], return_tensors="pt").items()
                if k in ("pixel_values", "image_grid_thw")
            }
            for c, i in zip(chats, images)
        ]
    else:
        tok = AutoTokenizer.from_pretrained(path)
        tok.padding_side = "left"
        enc, mm = tok(texts, return_tensors="pt", padding=True), None
    R = 3
    gen = torch.Generator().manual_seed(0)
    responses = torch.randint(0, 400, (3, R), generator=gen)
    resp_mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    ids = torch.cat([enc["input_ids"], responses], 1)
    mask = torch.cat([enc["attention_mask"], resp_mask], 1)
    return {
        "ids": ids,
        "mask": mask,
        "mm": mm,
        "R": R,
        "vision": vision,
        "weights": torch.randn(3, R, generator=gen) * resp_mask,
    }


@pytest.mark.parametrize(
    "vision, fused", [(False, False), (True, False), (False, True)], ids=["text", "vl", "text-fused-kernels"]
)
def test_sequence_parallel_log_probs_and_grads_match(tmp_path, tiny_lm_path, tiny_vl_path, vision, fused):
    """fused: the SP ranks compute their slices' log-probs in the fused head (model.use_fused_kernels)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from verl_npu.models.forward import response_log_probs

    path = str(tiny_vl_path if vision else tiny_lm_path)
    data = {**_inputs(path, vision), "fused": fused}
    torch.save(data, tmp_path / "inputs.pt")
    spawn_gloo(_worker, path, str(tmp_path))
    sp = torch.load(tmp_path / "sp.pt", weights_only=False)

    cls = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    model = cls.from_pretrained(path, dtype=torch.float32)
    lp, ent = response_log_probs(
        model,
        data["ids"],
        data["mask"],
        data["R"],
        multi_modal_inputs=data["mm"],
        remove_padding=True,
        with_entropy=True,
    )
    (lp * data["weights"]).sum().backward()
    m = data["mask"][:, -data["R"] :].bool()
    torch.testing.assert_close(sp["lp"][m], lp.detach()[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sp["ent"][m], ent.detach()[m], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        spsq = response_log_probs(
            model,
            data["ids"],
            data["mask"],
            data["R"],
            multi_modal_inputs=data["mm"],
            remove_padding=True,
            with_sum_pi_squared=True,
        )[2]
    torch.testing.assert_close(sp["spsq"][m], spsq[m], atol=1e-6, rtol=1e-5)
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(sp["grads"][name], p.grad, atol=1e-5, rtol=1e-4, msg=name)
