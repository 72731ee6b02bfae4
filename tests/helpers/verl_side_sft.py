"""Upstream verl 0.9.1's SFT dataset and SFT loss on given conversations (run in the verl side venv by
tests/sft/test_verl_sft.py; verl-npu is not importable there).

    python tests/helpers/verl_side_sft.py INPUTS.pt OUTPUTS.pt

INPUTS.pt holds `model` (a Hugging Face folder: the tiny model and its tokenizer), `parquet` (conversations in a
`messages` column) and `config` (the SFT dataset's data keys). verl's `MultiTurnSFTDataset` (pad_mode no_padding)
tokenizes every row; the model (float32) gives each row's token log-probs as verl's no-padding path lays them out
(position t holds log p(token t+1), the row's last position wraps); verl's `sft_loss` (dp_size 1, batch_num_tokens
the sum of the loss masks) gives the loss, which is backpropagated. OUTPUTS gets each row's `input_ids` and
`loss_mask`, the `loss` and the gradient of every parameter (`grads`, by name).
"""

from __future__ import annotations

import sys

import torch


def main(inputs: str, outputs: str) -> None:
    from tensordict import TensorDict
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
    from verl.workers.utils.losses import sft_loss

    case = torch.load(inputs, weights_only=False)
    tokenizer = AutoTokenizer.from_pretrained(case["model"])
    dataset = MultiTurnSFTDataset(case["parquet"], tokenizer, {**case["config"], "pad_mode": "no_padding"})
    rows = [dataset[i] for i in range(len(dataset))]
    model = AutoModelForCausalLM.from_pretrained(case["model"], torch_dtype=torch.float32, attn_implementation="eager")
    log_probs = []
    for row in rows:
        ids = row["input_ids"]
        logits = model(input_ids=ids[None]).logits[0].float()
        labels = torch.roll(ids, shifts=-1)
        log_probs.append(torch.log_softmax(logits, dim=-1).gather(-1, labels[:, None])[:, 0])
    masks = [row["loss_mask"] for row in rows]
    data = TensorDict(
        {
            "loss_mask": torch.nested.as_nested_tensor(masks, layout=torch.jagged),
            "dp_size": torch.tensor(1),
            "batch_num_tokens": torch.stack([m.sum() for m in masks]).sum(),
        },
        batch_size=[],
    )
    loss, _ = sft_loss(None, {"log_probs": torch.nested.as_nested_tensor(log_probs, layout=torch.jagged)}, data)
    loss.backward()
    torch.save(
        {
            "input_ids": [r["input_ids"].tolist() for r in rows],
            "loss_mask": [m.tolist() for m in masks],
            "loss": float(loss),
            "grads": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        },
        outputs,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
