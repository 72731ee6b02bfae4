"""Upstream verl's own launch scripts on verl-npu (issues 9 and 23): the overrides of verl's example,
DAPO recipe, GSPO, rollout-correction, NPU and NPU-CI scripts (tests/fixtures/verl_scripts/*.txt, source path
and commit in each header), with only their data, model and reward-file paths replaced by local tiny
ones, go through `verl-npu validate --check-paths`: each passes, or fails only on a named refusal of a
verl feature verl-npu does not support (Megatron, SGLang, rollout correction until it lands, ...) or on
a named check (CHECKS), as its `# expect:` line says (the custom agent loop script, issue 39, passes with its
loop file pointed at tests/toys/agent_loops.yaml and trains 2 steps with it). Four of them (one with verl's prime reward manager) train for 2 steps on CPU with only
sizing overrides (slow).

verl's multi-turn examples (issue 25: GSM8K with its tool, on SGLang and on vLLM for Ascend, geo3k with
its tool, the search tool, ReTool) carry a `# tool_config:` line (their tool config file, copied under
tool_config/ with its source) and a `# fixed:` line: the overrides each refusal's fix names (e.g.
rollout.name=hf for sglang); with them applied the script must give `# fixed expect:` (pass, or the
tools verl-npu does not build). The search-tool script's data (`# data: search`) is the synthetic Search-R1 set
with its corpus; its 2-step run starts verl-npu's retrieval server on a free port and points a copy of the
script's tool config at it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from verl_npu.cli import main
from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "verl_scripts"
BASE = HERE / "verl_base.yaml"
#: the agent loop file a script's agent_loop_config_path is pointed at: a toy loop written against verl's interface
AGENT_LOOPS = Path(__file__).resolve().parents[1] / "toys" / "agent_loops.yaml"
SCRIPTS = sorted(HERE.glob("*.txt"))
#: a declared refusal -> words one of its error messages contains
FEATURES = {
    "lora": ("LoRA",),
    "megatron": ("Megatron",),
    "sglang": ("sglang",),
    "multi-turn": ("multi-turn",),
    "reward model": ("reward model",),
    # algorithm.rollout_correction.* (refused until rollout correction lands, issue 23)
    "rollout correction": ("rollout importance-sampling correction", "rollout_correction"),
    "hybrid sharding": ("hybrid sharding",),
    "sync rollout": ("mode=sync",),
    # the multi-turn examples (issue 25)
    "over-sampling": ("over-sampling",),
    "custom dataset": ("custom dataset classes",),
    "multimodal inputs": ("processor outputs of multimodal",),
    "tool format": ("multi_turn.format",),
    "geo3k tool": ("Geo3kTool",),
}
#: declared problems that are verl-npu's checks of a setting, not a missing feature -> words of the message
CHECKS = {
    "group size": ("needs at least 2 responses per prompt",),
    # a profiler tool with nothing to profile (the torch_memory script names no profiled role)
    "profiler setup": ("nothing would be profiled",),
    # a shell variable the script never sets, passed as `key=` (Hydra: an empty string)
    "empty value": ("got '' (str)",),
}


@pytest.fixture(autouse=True)
def _validated_as_on_their_devices(monkeypatch):
    """The scripts are validated as on the accelerators they were written for (trainer.device null
    detects an NPU): on a CPU, vLLM settings are derived and checked for the CPU (chunked prefill off,
    tests/config/test_vllm_cpu_prefill_config.py), and this machine may be one."""
    import verl_npu.device as device

    monkeypatch.setattr(device, "configured_device", lambda requested=None: device.DeviceInfo("npu"))


def read_script(path: Path) -> tuple[list[str], dict[str, str]]:
    """(overrides, header fields) of one corpus file."""
    overrides, header = [], {}
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            header[key.strip()] = value.strip()
        elif line.strip():
            overrides.append(line.strip())
    return overrides, header


@pytest.fixture(scope="module")
def local(tmp_path_factory, tiny_lm_path, tiny_vl_path):
    """Local stand-ins: tiny parquet data (text, VL, and text and VL in verl's multi-turn tool format), model
    folders and a reward file.

    Validation reads only a model's config.json, so the stand-in folders are the tiny models with the
    head counts and length limit of the scripts' real models (40 attention / 8 key-value heads, like
    Qwen2.5-32B, fit every TP and SP size the scripts use; 64K positions fit their lengths)."""
    import pyarrow as pa

    from verl_npu.data import geometry3k, gsm8k, gsm8k_multiturn, search_r1

    root = tmp_path_factory.mktemp("verl_scripts")
    gsm8k.prepare_synthetic(root / "text", 32, 8, seed=0)
    gsm8k_multiturn.prepare_synthetic(root / "multiturn", 32, 8, seed=0)
    search_r1.prepare_synthetic(root / "search", 32, 8, seed=0)  # and search/corpus.jsonl
    geometry3k.prepare_synthetic(root / "vl", 32, 8, seed=0, image_size=56)
    geometry3k.prepare_synthetic(root / "vl_multiturn", 32, 8, seed=0, image_size=56, multiturn="geo3k")
    models = {}
    for kind, src in (("text", tiny_lm_path), ("vl", tiny_vl_path)):
        dst = root / f"model_{kind}"
        shutil.copytree(src, dst)
        conf = json.loads((dst / "config.json").read_text())
        for node in (conf, conf.get("text_config") or {}):
            if "num_attention_heads" in node:
                node.update(num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=65536)
        (dst / "config.json").write_text(json.dumps(conf))
        models[kind] = dst
    # the custom agent loop script's rows name the toy loop (tests/toys/agent_loops.yaml)
    import pyarrow.parquet as pq

    (root / "agent_loop").mkdir()
    for split in ("train", "test"):
        table = pq.read_table(root / "multiturn" / f"{split}.parquet")
        table = table.drop_columns([c for c in ("agent_name",) if c in table.column_names])
        pq.write_table(
            table.append_column("agent_name", pa.array(["two_turn_toy"] * len(table))),
            root / "agent_loop" / f"{split}.parquet",
        )
    models["multiturn"], models["vl_multiturn"], models["agent_loop"] = models["text"], models["vl"], models["text"]
    models["search"] = models["text"]
    reward = root / "reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(ground_truth in solution_str)\n"
    )
    return {"root": root, "models": models, "reward": reward}


def localized(overrides: list[str], kind: str, local: dict, out: Path, tool_config: str | None = None) -> list[str]:
    """The script's overrides with its data / model / reward / checkpoint paths pointing at local ones (and
    its tool config file at the corpus's copy, tool_config/<header's tool_config>)."""
    data = local["root"] / kind
    paths = {
        "data.train_files": data / "train.parquet",
        "data.val_files": data / "test.parquet",
        "actor_rollout_ref.model.path": local["models"][kind],
        "critic.model.path": local["models"][kind],
        "custom_reward_function.path": local["reward"],
        "trainer.default_local_dir": out / "checkpoints",
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": AGENT_LOOPS,
    }
    if tool_config:
        paths["actor_rollout_ref.rollout.multi_turn.tool_config_path"] = HERE / "tool_config" / tool_config
    result = []
    for item in overrides:
        key = item.split("=", 1)[0]
        bare = key.lstrip("+")
        result.append(f"{key}={paths[bare]}" if bare in paths else item)
    return [*result, f"af_output_dir={out}"]


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_verl_script_validates_or_is_refused_by_name(script, local, tmp_path, capsys):
    overrides, header = read_script(script)
    assert header["source"].startswith("github.com/volcengine/verl ") and " @ " in header["source"]
    args = localized(overrides, header["data"], local, tmp_path / "out", header.get("tool_config"))
    assert_outcome(args, header["expect"], capsys)
    if "fixed" in header:
        # each refusal's fix applied (e.g. rollout.name=hf for sglang): what is left is `fixed expect`
        assert_outcome([*args, *header["fixed"].split()], header["fixed expect"], capsys)


def assert_outcome(args: list[str], expect: str, capsys) -> None:
    """`verl-npu validate --check-paths` of the overrides passes (expect: pass) or fails exactly on the
    declared refusals / checks (expect: refused: a, b), each with a fix."""
    code = main(["validate", str(BASE), *args, "--check-paths"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unknown key" not in err, err
    try:
        load_recipe(BASE, args, check_paths=True)
        every = []
    except ConfigErrors as e:
        every = e.problems
    assert (code == 0) == (every == [])
    problems = every
    if expect == "pass":
        assert problems == [], "\n".join(map(str, problems))
        return
    assert code == 1
    declared = {w.strip() for w in expect.removeprefix("refused:").split(",")}
    found = set()
    for p in problems:
        checks = {name for name, words in CHECKS.items() if any(w in p.message for w in words)}
        refusal = "does not support" in p.message or "not implemented" in p.message
        assert (refusal or checks) and p.fix, str(p)
        hits = checks | {name for name, words in FEATURES.items() if any(w in p.message or w in p.key for w in words)}
        assert hits, f"refused for something outside the named features: {p}"
        found |= hits
    assert found == declared, "\n".join(map(str, problems))


def test_the_corpus_is_big_enough_and_covers_the_families():
    names = {p.stem for p in SCRIPTS}
    assert len(names) >= 15
    for family in (
        "grpo",
        "ppo",
        "rloo",
        "remax",
        "reinforce_pp",
        "npu_ci",
        "_npu",
        "vl",
        "dapo",
        "gspo",
        "rollout_corr",
        "multiturn_gsm8k_tool",
        "multiturn_geo3k_tool",
        "multiturn_search_tool",
        "multiturn_retool",
        "prime",
        "agent_loop_custom",
    ):
        assert any(family in n for n in names), family


# ------------------------------------------------------------------ three scripts train on CPU
#: the overrides that size a script for 2 CPU workers and tiny models (batch sizes, lengths, device
#: counts); `rollout.name=hf` because vLLM is not installed in this environment (CPU)
SIZING = {
    "data.train_batch_size": "4",
    "data.max_prompt_length": "256",
    "data.max_response_length": "4",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
    "actor_rollout_ref.rollout.n": "2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
    "actor_rollout_ref.rollout.name": "hf",
    "trainer.n_gpus_per_node": "2",
    "trainer.nnodes": "1",
    "trainer.total_training_steps": "2",
}
RUNS = {
    "grpo_qwen2_5_7b_npu": "tiny://qwen2",
    "grpo_qwen2_5_vl_3b_npu": "tiny://qwen25vl",
    "npu_ci_qwen2_5_05b_grpo": "tiny://qwen2",
    "prime_rloo_qwen2_5_7b_math": "tiny://qwen2",
}
#: what a run changes beyond SIZING: the prime manager's pool sized for 2 CPU cores (verl's figure is 64), on one
#: worker (the manager scores in the controller; the 2-worker path is the other runs')
RUN_EXTRA = {"prime_rloo_qwen2_5_7b_math": ["reward_model.prime.num_processes=2", "trainer.n_gpus_per_node=1"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_verl_script_trains_two_steps_on_cpu(name, local, tmp_path):
    """A text GRPO, a VL GRPO and an NPU CI script train for 2 steps on 2 CPU workers with the tiny
    models; only SIZING (and the local paths) are changed (2 workers: the multi-worker path; one
    worker with their ref.fsdp_config.param_offload=true is tests/workers/test_offload.py's)."""
    import subprocess
    import sys

    overrides, header = read_script(HERE / f"{name}.txt")
    args = localized(overrides, header["data"], local, tmp_path / "out")
    sizing = {**SIZING, **dict(item.split("=", 1) for item in RUN_EXTRA.get(name, []))}
    args = [a for a in args if a.split("=", 1)[0].lstrip("+") not in sizing]
    args = [
        f"actor_rollout_ref.model.path={RUNS[name]}" if a.startswith("actor_rollout_ref.model.path=") else a
        for a in args
    ] + [f"{k}={v}" for k, v in sizing.items()]
    out = subprocess.run(
        [sys.executable, "-m", "verl_npu.cli", "run", str(BASE), *args], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "actor/pg_loss" in r]
    assert steps == [1, 2]
    assert all(r["response_length/mean"] > 0 for r in rows if "actor/pg_loss" in r)
    if name.startswith("prime"):  # scored by the prime manager's worker processes: its extras, none timed out
        assert all(
            r["critic/score/prime_timeout/mean"] == 0 and "critic/score/acc/mean" in r
            for r in rows
            if "actor/pg_loss" in r
        )


#: verl's multi-turn scripts that train for 2 steps on CPU: their `# fixed:` overrides (rollout.name=hf for
#: sglang, ...), SIZING, and a response budget that holds a tool call and its reply
MULTI_TURN_RUNS = (
    "multiturn_gsm8k_tool_qwen2_5_3b",
    "multiturn_retool_qwen3_4b_dapo",
    "multiturn_geo3k_tool_qwen2_5_vl_3b",
    "multiturn_search_tool_qwen2_5_3b",
)


@pytest.mark.slow
@pytest.mark.parametrize("name", MULTI_TURN_RUNS)
def test_verl_multiturn_script_trains_two_steps_on_cpu(name, local, tmp_path):
    """verl's GSM8K-with-tool, ReTool (with its Sandbox Fusion tool, built here as the sandboxed code
    interpreter), geo3k-with-tool (pictures in the prompts, verl's Geo3kTool) and search-tool (verl's SearchTool
    querying verl-npu's retrieval server over the synthetic corpus, started here) scripts train 2 steps with
    the multi-turn agent loop on 2 CPU workers, tiny Qwen2 / Qwen2.5-VL, the hf engine: only the paths, each
    refusal's fix and SIZING are changed."""
    import subprocess
    import sys

    overrides, header = read_script(HERE / f"{name}.txt")
    tool_config = HERE / "tool_config" / header["tool_config"]
    server = None
    if header["data"] == "search":  # the script's tool config with the URL of a server started here
        from verl_npu.tools.retrieval_server import RetrievalServer, read_corpus

        server = RetrievalServer(read_corpus(local["root"] / "search" / "corpus.jsonl"), port=0)
        server.start_in_thread()
        copy = tmp_path / header["tool_config"]
        copy.write_text(tool_config.read_text().replace("http://127.0.0.1:8000/", f"http://127.0.0.1:{server.port}/"))
        tool_config = copy
    args = localized(overrides, header["data"], local, tmp_path / "out", header["tool_config"])
    args = [
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}"
        if a.startswith("actor_rollout_ref.rollout.multi_turn.tool_config_path=")
        else a
        for a in args
    ]
    model = "tiny://qwen25vl" if header["data"].startswith("vl") else "tiny://qwen2"
    # the search prompt (Search-R1's instructions) is longer than SIZING's 256 tokens
    sizing = {
        **SIZING,
        "data.max_response_length": "48",
        "actor_rollout_ref.model.path": model,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "2",
        **({"data.max_prompt_length": "512"} if server else {}),
    }
    args = [a for a in [*args, *header["fixed"].split()] if a.split("=", 1)[0].lstrip("+") not in sizing]
    args += [f"{k}={v}" for k, v in sizing.items()]
    try:
        out = subprocess.run(
            [sys.executable, "-m", "verl_npu.cli", "run", str(BASE), *args], capture_output=True, text=True, timeout=600
        )
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in trained] == [1, 2]
    assert all(r["num_turns/mean"] >= 2 and "tool_call_counts/mean" in r for r in trained)


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_verl_script_gets_a_memory_plan(script, local, tmp_path, capsys):
    """`verl-npu plan` of every script with its own model path (a hub id or a folder name, neither
    readable here: planned from the known shapes of the model it names, verl_npu/config/known_models.py);
    a script verl-npu refuses gets the same named refusal, without a traceback. A script whose `# fixed:`
    overrides make it pass is planned with them."""
    overrides, header = read_script(script)
    models = {
        i.split("=", 1)[0].lstrip("+"): i.split("=", 1)[1]
        for i in overrides
        if i.split("=", 1)[0].lstrip("+") in ("actor_rollout_ref.model.path", "critic.model.path")
    }
    fixed = header.get("fixed expect") == "pass"
    args = [
        a
        for a in localized(overrides, header["data"], local, tmp_path / "out", header.get("tool_config"))
        if a.split("=", 1)[0].lstrip("+") not in models
    ]
    args += [*(header["fixed"].split() if fixed else []), *(f"{key}={value}" for key, value in models.items())]
    code = main(["plan", str(BASE), *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    if header["expect"] == "pass" or fixed:
        assert code == 0, captured.err
        assert "peak: " in captured.out and "known shapes of Qwen/" in captured.out, captured.out
    else:
        assert code == 1 and (
            "does not support" in captured.err or "not implemented" in captured.err or "needs at least" in captured.err
        ), captured.err


@pytest.mark.slow
def test_verl_agent_loop_script_trains_two_steps_on_cpu(local, tmp_path):
    """verl's multi-turn script with a custom agent loop file (rollout.agent.agent_loop_config_path) trains 2
    steps on 2 CPU workers with tiny Qwen2 and the hf engine: every row names the toy two-turn loop
    (tests/toys/toy_agent_loop.py, written against verl's interface), so every trajectory has its 4 turns and
    the reward function gets its extra fields."""
    import subprocess
    import sys

    name = "agent_loop_custom_qwen2_5_3b"
    overrides, header = read_script(HERE / f"{name}.txt")
    args = localized(overrides, header["data"], local, tmp_path / "out", header["tool_config"])
    sizing = {
        **SIZING,
        "data.max_response_length": "24",
        "actor_rollout_ref.model.path": "tiny://qwen2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "2",
    }
    args = [a for a in args if a.split("=", 1)[0].lstrip("+") not in sizing] + [f"{k}={v}" for k, v in sizing.items()]
    out = subprocess.run(
        [sys.executable, "-m", "verl_npu.cli", "run", str(BASE), *args], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in trained] == [1, 2]
    assert all(r["num_turns/mean"] == 4 and r["response_length/mean"] > 0 for r in trained), trained
