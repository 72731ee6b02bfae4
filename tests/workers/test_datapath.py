"""The thinner data path: the loader yields a `Batch`, each worker call is sent only the columns its
method reads (and gives what the whole batch would give), a rollout gets the prompts' other columns
back, the skipped old-log-prob pass returns the update forward's entropies as a column, the sequence
score sits on the last trained token, masks are built once, and the typed config is built once."""

from __future__ import annotations

import pytest
import torch
from test_e2e_cpu import _gsm8k_like, tiny_overrides

from verl_npu import algorithms
from verl_npu.batch import Batch, UndeclaredColumn, reads
from verl_npu.config import load_recipe
from verl_npu.rollout.base import SamplingParams, finish_rollout
from verl_npu.workers.group import LocalWorkerGroup

TEXT = {
    "actor_rollout_ref.model.path": "tiny://qwen2",
    "data.max_prompt_length": 48,
    "trainer.logger": "[console]",
    "actor_rollout_ref.actor.use_kl_loss": "false",
}


class RecordingGroup(LocalWorkerGroup):
    """The real in-process group, recording which columns each call was sent."""

    def __init__(self, workers):
        super().__init__(workers)
        self.sent_columns: dict[str, set[str]] = {}
        self.sent_widths: dict[str, int] = {}

    def scatter(self, method, chunks, *args, role="actor", **kwargs):
        self.sent_columns[method] = set(chunks[0].tensors) | set(chunks[0].lists)
        self.sent_widths[method] = chunks[0]["input_ids"].shape[1]
        return super().scatter(method, chunks, *args, role=role, **kwargs)


def _setup(tmp_path, **extra):
    from verl_npu.data import RLDataset, StatefulBatchLoader
    from verl_npu.device import detect_device
    from verl_npu.models.loading import load_tokenizer_and_processor
    from verl_npu.workers.roles import build_workers

    data = _gsm8k_like(tmp_path / "gsm")
    cfg = load_recipe("tiny_geo3k", tiny_overrides(tmp_path, data, **{**TEXT, **extra})).typed
    tokenizer, _ = load_tokenizer_and_processor("tiny://qwen2")
    loader = StatefulBatchLoader(RLDataset(cfg.data.train_files, tokenizer, None, cfg.data), 4, shuffle=False)
    group = RecordingGroup(build_workers(cfg, 2, detect_device("cpu")))
    group.init_model()
    return cfg, loader, group


def test_calls_are_sent_only_the_columns_they_read(tmp_path, tiny_cache):
    cfg, loader, group = _setup(tmp_path, **{"actor_rollout_ref.actor.ppo_mini_batch_size": 2})
    prompts = next(iter(loader))
    assert isinstance(prompts, Batch) and {"ground_truth", "extra_info", "data_source"} <= set(prompts.lists)
    prompts.set("uid", [f"1-{i}" for i in range(len(prompts))])
    params = SamplingParams.for_training(cfg.actor_rollout_ref.rollout)
    batch = group.generate_sequences(prompts, params)
    # the prompts' columns the engine was not sent came back, repeated per sample, in the engine's row order
    assert "ground_truth" not in group.sent_columns["generate_sequences"]
    assert batch["ground_truth"] == [gt for gt in prompts["ground_truth"] for _ in range(params.n)]
    assert batch["extra_info"] == [e for e in prompts["extra_info"] for _ in range(params.n)]
    assert batch["responses"].shape == (len(prompts) * params.n, cfg.data.max_response_length)
    old = group.compute_log_prob(batch)
    sent = group.sent_columns["compute_log_prob"]
    # no texts, no extra_info, no masks (the dataset's multi_modal_inputs column holds a text row's empty inputs)
    assert sent - {"multi_modal_inputs"} == {"input_ids", "attention_mask", "responses"}, sent
    # sent without the left padding every row shares (the engine drops it before each forward anyway)
    assert group.sent_widths["compute_log_prob"] < batch["input_ids"].shape[1]
    assert group.sent_widths["generate_sequences"] == prompts["input_ids"].shape[1]  # the rollout's prompts keep it
    # the same numbers as the whole batch sent to the worker itself
    whole = group.workers["actor"].compute_log_prob(batch)
    assert torch.equal(old["old_log_probs"], whole["old_log_probs"])
    batch.update(old)
    batch.set("advantages", torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(0)))
    result = group.update_actor(batch)
    sent = group.sent_columns["update_actor"]
    assert sent - {"multi_modal_inputs"} == {
        "input_ids",
        "attention_mask",
        "responses",
        "response_mask",
        "advantages",
        "old_log_probs",
    }, sent
    assert result["actor/grad_norm"] > 0 and len(result.columns) == 0  # the pass ran: nothing kept


def test_the_skipped_pass_returns_the_update_forwards_entropies(tmp_path, tiny_cache):
    """hf, one epoch of one mini-batch: update_actor told to take the old log-probs from its own forward
    keeps that forward's entropies (`entropys`, rows in the batch's order), which equal those of the pass
    it replaces; told they are in the batch when they are not, it refuses."""
    from verl_npu.workers.actor import OldLogProbs

    cfg, loader, group = _setup(
        tmp_path, **{"actor_rollout_ref.actor.ppo_mini_batch_size": 4, "actor_rollout_ref.actor.shuffle": "true"}
    )
    assert group.old_log_prob_pass_reasons() == []
    prompts = next(iter(loader))
    prompts.set("uid", [f"1-{i}" for i in range(len(prompts))])
    batch = group.generate_sequences(prompts, SamplingParams.for_training(cfg.actor_rollout_ref.rollout))
    before = group.compute_log_prob(batch)["entropys"]  # what the pass would give, before the update
    batch.set("advantages", torch.ones(batch["response_mask"].shape))
    with pytest.raises(RuntimeError, match="no old_log_probs column"):
        group.update_actor(batch, OldLogProbs.PASS)
    result = group.update_actor(batch, OldLogProbs.UPDATE_FORWARD)
    kept = result.columns["entropys"]
    assert kept.shape == before.shape
    mask = batch["response_mask"].bool()
    assert torch.allclose(kept[mask], before[mask], rtol=1e-4, atol=1e-5)
    assert not any(key.startswith("_old/") for key in result)


def test_only_and_reads():
    @reads("x", "gone")
    def method(batch):
        return batch

    batch = Batch({"x": torch.arange(3), "y": torch.zeros(3)}, {"text": ["a", "b", "c"]}, {"note": 1})
    sent = batch.only(method.reads)
    assert set(sent.tensors) == {"x"} and not sent.lists and not sent.meta
    assert sent["x"] is batch["x"]  # the same tensor: nothing copied


class _Peeker:
    """A worker whose method reads a column it does not declare (`secret`) and one no batch has (`images`)."""

    @reads("x")
    def peek(self, batch):
        images = batch.get("images")  # absent everywhere: None, as a text run's code relies on
        return Batch({"y": batch["x"] + 1}, {"got": list(batch.get("secret")), "images": [images] * len(batch)})


def _peek_batch():
    return Batch({"x": torch.arange(4), "attention_mask": torch.ones(4, 2)}, {"secret": list("abcd")})


def test_an_undeclared_read_fails_naming_the_method_and_the_column():
    group = LocalWorkerGroup({"actor": _Peeker()})
    with pytest.raises(UndeclaredColumn, match=r"_Peeker\.peek read column 'secret'.*add it to @reads"):
        group.dispatch("peek", _peek_batch())
    sent = group.sent("peek", _peek_batch())
    for read in (lambda b: b["secret"], lambda b: "secret" in b, lambda b: b.get("secret", 0)):
        with pytest.raises(UndeclaredColumn, match="add it to @reads"):
            read(sent)
        # the worker's reshaping keeps the refusal (micro-batches, rows repeated, trimmed, moved)
        for part in (
            sent.select([1, 0]),
            sent.slice(0, 2),
            sent.repeat_interleave(2),
            sent.to("cpu"),
            Batch.concat(sent.split(2)),
            sent.only(["x"]),
        ):
            with pytest.raises(UndeclaredColumn):
                read(part)
    assert "images" not in sent and sent.get("images") is None
    with pytest.raises(KeyError):
        sent["images"]
    sent.set("secret", ["w"] * 4)  # a column the method writes itself is its own
    assert sent["secret"] == ["w"] * 4


def test_an_undeclared_read_fails_after_a_pickle_round_trip():
    """What a Ray worker receives: the withheld names travel with the pickled batch."""
    import pickle

    from ray import cloudpickle  # what Ray serialises a task's arguments with

    group = LocalWorkerGroup({"actor": _Peeker()})
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)):
        received = loads(dumps(group.sent("peek", _peek_batch())))
        assert set(received.tensors) == {"x"} and not received.lists
        with pytest.raises(UndeclaredColumn, match=r"_Peeker\.peek read column 'secret'.*add it to @reads"):
            _Peeker().peek(received)
    error = pickle.loads(pickle.dumps(UndeclaredColumn("m read column 'c': add it to @reads")))
    assert isinstance(error, UndeclaredColumn) and "add it to @reads" in str(error)  # Ray carries it back as it is


def test_a_declared_read_and_what_comes_back_withhold_nothing():
    class Declared:
        @reads("x", "secret")
        def peek(self, batch):
            return _Peeker.peek(self, batch)

    out = LocalWorkerGroup({"actor": Declared()}).dispatch("peek", _peek_batch())
    assert out["got"] == list("abcd") and out["images"] == [None] * 4
    assert not out.withheld and out.get("x") is None  # the controller's own batch again: nothing refused


def test_scores_sit_on_the_last_trained_token():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]])
    out = algorithms.scores_on_last_token(torch.tensor([1.0, 2.0, 3.0, 4.0]), mask)
    assert out.dtype == torch.float32
    assert out.tolist() == [[0, 1, 0, 0], [0, 0, 0, 2], [3, 0, 0, 0], [0, 0, 4, 0]]


def test_finish_rollout_builds_the_masks_once_with_lengths():
    prompts = Batch({"input_ids": torch.ones(2, 2, dtype=torch.long), "attention_mask": torch.ones(2, 2)})
    responses = torch.tensor([[5, 9, 0, 0], [5, 6, 0, 0]])  # 9: EOS; row 1 stopped without one after 2 tokens
    out = finish_rollout(prompts, responses, eos_ids=[9], pad_id=0, n=1, lengths=torch.tensor([2, 2]))
    assert out["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 0, 0]]
    assert out["attention_mask"][:, 2:].tolist() == out["response_mask"].tolist()
    without = finish_rollout(prompts, responses, eos_ids=[9], pad_id=0, n=1)
    assert without["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]  # padding read as tokens


def test_the_typed_config_is_built_once_and_again_after_a_derived_change():
    rc = load_recipe("tiny_geo3k")
    typed = rc.typed
    assert rc.typed is typed
    rc.set_derived("backend_config.data.train_batch_size", 16, "a test")
    assert rc.typed is not typed and rc.typed.data.train_batch_size == 16


@pytest.mark.parametrize("shuffle", [False, True])
def test_the_loader_yields_batches(tmp_path, shuffle):
    from verl_npu.data import StatefulBatchLoader

    rows = [{"input_ids": torch.tensor([i, i]), "attention_mask": torch.ones(2), "index": i} for i in range(6)]
    batches = list(StatefulBatchLoader(rows, 3, shuffle=shuffle, seed=0))
    assert all(isinstance(b, Batch) for b in batches) and len(batches) == 2
    assert sorted(i for b in batches for i in b["index"]) == list(range(6))
    assert all(b["input_ids"][:, 0].tolist() == b["index"] for b in batches)
