"""verl's config language on verl-npu (issue 9): every verl key is supported, a no-op here, or refused
by name; verl's override spellings (`+`, `++`, `~`, a plain string for a list, short-form `${...}`)
work; no accepted key is read nowhere; the config package imports one way; docs/verl_compat.md is
generated from the schema."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from verl_npu.config import ALIASES, SCHEMA, VERL_ONLY, load_recipe
from verl_npu.config.compat import NOOP, REFUSED, SUPPORTED, UNKNOWN, render_compat, status
from verl_npu.errors import ConfigErrors

REPO = Path(__file__).resolve().parents[2]
VERL_KEYS = [
    line.strip()
    for line in (REPO / "tests" / "fixtures" / "verl_ppo_trainer_keys.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


def problems(overrides, recipe="tiny_gsm8k"):
    with pytest.raises(ConfigErrors) as info:
        load_recipe(recipe, overrides)
    return info.value.problems


# ------------------------------------------------------------------ every verl key is known
def test_every_verl_key_is_supported_noop_or_refused_never_unknown():
    assert len(VERL_KEYS) > 500
    unknown = [k for k in VERL_KEYS if status(k).kind == UNKNOWN]
    assert unknown == []
    kinds = {status(k).kind for k in VERL_KEYS}
    assert {SUPPORTED, NOOP, REFUSED} <= kinds


def test_verl_only_keys_load_at_their_default_and_aliases_reach_their_key():
    """One load with every no-op / off-only verl key at its default: all accepted, none unknown."""
    overrides = [f"{k.removeprefix('backend_config.')}={_text(v.default)}" for k, v in VERL_ONLY.items()]
    rc = load_recipe("tiny_gsm8k", overrides)
    assert {d.key for d in rc.noop} == set(VERL_ONLY)
    assert all(d.reason for d in rc.noop)
    rc = load_recipe(
        "tiny_gsm8k",
        [
            "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
            "actor_rollout_ref.actor.optim.clip_grad=0.5",
            "ray_kwargs.ray_init.num_cpus=2",
            "critic.optim.lr_scheduler_type=cosine",
        ],
    )
    b = rc.backend
    assert b.actor_rollout_ref.actor.optim.warmup_style == "cosine" and b.actor_rollout_ref.actor.grad_clip == 0.5
    assert b.critic.optim.warmup_style == "cosine"  # the critic's spelling too (verl's optim config is shared)
    assert b.ray_init.num_cpus == 2
    assert set(ALIASES.values()) <= set(SCHEMA)
    [p] = problems(["actor_rollout_ref.actor.optim.lr_scheduler_type=linear"])
    assert p.key.endswith("optim.lr_scheduler_type")  # an error names the key the user wrote


def _text(value) -> str:
    from verl_npu.config.tree import scalar

    return scalar(value)


def test_issue_keys_are_noop_at_their_noop_value_and_refused_by_name_otherwise():
    noop = [
        "actor_rollout_ref.ref.use_torch_compile=false",
        "actor_rollout_ref.ref.use_torch_compile=true",
        "actor_rollout_ref.nccl_timeout=1200",
        "trainer.use_legacy_worker_impl=disable",
        "actor_rollout_ref.rollout.layered_summon=true",
        "actor_rollout_ref.rollout.data_parallel_size=1",
        "actor_rollout_ref.rollout.expert_parallel_size=1",
        "trainer.max_critic_ckpt_to_keep=2",
        "actor_rollout_ref.model.lora_adapter_path=null",
        "actor_rollout_ref.model.exclude_modules=null",
        "actor_rollout_ref.rollout.multi_stage_wake_up=false",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=null",
    ]
    load_recipe("tiny_gsm8k", noop)
    # accepted since issue 39 (on cpu a noted no-op; tests/workers/test_activation_offload.py)
    load_recipe("tiny_gsm8k", ["actor_rollout_ref.model.enable_activation_offload=true"])
    # interactions are read (issue 25); with multi_turn off the key is only warned about
    load_recipe("tiny_gsm8k", ["actor_rollout_ref.rollout.multi_turn.interaction_config_path=/i.yaml"])
    load_recipe("tiny_gsm8k", ["actor_rollout_ref.rollout.multi_turn.function_tool_path=/t.py"])  # function tools too
    refused = {
        "actor_rollout_ref.rollout.data_parallel_size=2": "data parallelism inside one rollout engine",
        "actor_rollout_ref.rollout.expert_parallel_size=4": "expert parallelism",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2": "Megatron",
        "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2": "Megatron",
        "critic.model.tokenizer_path=/t": "this critic option",
        "reward_model.rollout.name=vllm": "generative reward models",
        "actor_rollout_ref.rollout.multi_turn.format=llama3_json": "format=llama3_json",
        "actor_rollout_ref.rollout.name=sglang": "name=sglang",
        "data.return_raw_input_ids=true": "raw input ids",
        "data.return_full_prompt=true": "full prompt",
    }
    for override, what in refused.items():
        [p] = problems([override])
        assert p.key == "backend_config." + override.split("=")[0], override
        assert "does not support" in p.message and what in p.message and "unknown" not in p.message, (override, p)
        assert p.fix, override


def test_unknown_means_not_a_verl_key():
    [p] = problems(["data.max_prompt_lenght=10"])
    assert "unknown key" in p.message and "not a verl-npu or verl key" in p.message
    assert "max_prompt_length" in p.fix


# ------------------------------------------------------------------ override spellings
def test_logger_may_be_one_string():
    assert list(load_recipe("tiny_gsm8k", ["trainer.logger=console"]).backend.trainer.logger) == ["console"]


def test_hydra_prefixes_add_force_and_delete(tmp_path):
    rc = load_recipe("tiny_gsm8k", ["+data.seed=5", "++trainer.total_epochs=2"])
    assert rc.backend.data.seed == 5 and rc.backend.trainer.total_epochs == 2
    # ~key: the recipe's value goes, the schema default comes back
    rc = load_recipe("tiny_gsm8k", ["~trainer.total_training_steps", "~data.seed=1"])
    assert (
        rc.backend.trainer.total_training_steps is None
        and rc.backend.data.seed == SCHEMA["backend_config.data.seed"].default
    )
    # ~ on one entry of a free-form dict, after adding it
    rc = load_recipe(
        "tiny_gsm8k",
        [
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.a=1",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.b=2",
            "~actor_rollout_ref.rollout.engine_kwargs.vllm.a",
        ],
    )
    assert dict(rc.backend.actor_rollout_ref.rollout.engine_kwargs.vllm) == {"b": 2}


def test_short_form_interpolations_resolve_like_verl():
    rc = load_recipe(
        "tiny_gsm8k",
        [
            "data.max_response_length=7",
            "actor_rollout_ref.rollout.response_length=${data.max_response_length}",
            "trainer.experiment_name=${trainer.project_name}_x",
            "actor_rollout_ref.rollout.max_model_len=${oc.select:data.nope,100}",
        ],
    )
    b = rc.backend
    assert b.actor_rollout_ref.rollout.response_length == 7
    rc = load_recipe("tiny_gsm8k", ["actor_rollout_ref.ref.strategy=${actor_rollout_ref.actor.strategy}"])
    assert [(d.key.rsplit(".", 1)[-1], d.value) for d in rc.noop] == [("strategy", "fsdp2")]  # verl-only keys too
    [p] = problems(["actor_rollout_ref.rollout.data_parallel_size=${trainer.total_epochs}"])
    assert p.key.endswith("data_parallel_size") and "got 10" in p.message
    assert b.trainer.experiment_name == "verl_npu_demo_x" and b.actor_rollout_ref.rollout.max_model_len == 100


def test_a_reference_to_a_missing_key_is_a_clean_error_naming_it():
    [p] = problems(["actor_rollout_ref.rollout.response_length=${data.max_response_lenght}"])
    assert p.key.endswith("rollout.response_length") and "'data.max_response_lenght'" in p.message
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_npu.cli",
            "validate",
            "tiny_gsm8k",
            "actor_rollout_ref.rollout.response_length=${data.nope}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr and "data.nope" in out.stderr


# ------------------------------------------------------------------ never silently ignored
READERS = {"get", "select", "getattr", "hasattr", "c", "val", "_role_setting"}  # plus any *_get
WRITERS = {"put"}  # derive's "fill this key in"
NOT_CODE = {"config/schema.py", "config/schema_verl.py", "config/reference.py", "config/compat.py"}


def _strings(node: ast.AST) -> list[str]:
    """The key text a read uses: a string constant, the constant end of `PREFIX + "leaf"`, or the
    constant tail of an f-string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _strings(node.right)
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant)][-1:]
    return []


def _fn_name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def read_names() -> dict[str, set[str]]:
    """Last key segment -> files of verl_npu/ that read it (the schema and doc renderers excluded)."""
    root = REPO / "verl_npu"
    reads: dict[str, set[str]] = {}
    for file in root.rglob("*.py"):
        rel = str(file.relative_to(root))
        if rel in NOT_CODE:
            continue
        tree = ast.parse(file.read_text())
        written = {
            id(c.args[0]) for c in ast.walk(tree) if isinstance(c, ast.Call) and _fn_name(c) in WRITERS and c.args
        }
        for node in ast.walk(tree):
            found: list[str] = []
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                found = [node.attr]
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                found = _strings(node.slice)
            elif isinstance(node, ast.Call) and (_fn_name(node) in READERS or _fn_name(node).endswith("_get")):
                found = [s for a in node.args for s in _strings(a)]
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and id(node) not in written:
                found = _strings(node)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register":
                # a registry spec's *_key field names a key its callers read through the spec (RoleSpec.keep_key)
                found = [s for k in node.keywords if (k.arg or "").endswith("_key") for s in _strings(k.value)]
            for text in found:
                leaf = text.rstrip(".").rsplit(".", 1)[-1]
                if leaf:
                    reads.setdefault(leaf, set()).add(rel)
    return reads


def test_every_accepted_key_is_read_by_code_or_marked_noop_or_refused():
    """Walks the whole schema: a key that verl-npu accepts at more than its off value must be read
    somewhere in verl_npu/, or be marked in the schema as a no-op (`noop`, with the reason) or refused
    unless off (`off_only`, with what is missing).

    "Read by code" is established statically, over the AST of every module of verl_npu/ except the
    schema and the doc renderers: the key's last segment must appear as an attribute load
    (`cfg.data.shuffle`), a subscript (`cfg["shuffle"]`), a string argument of a reader call
    (`get`, `select`, `getattr`, `c`, `val`, any `*_get`: `_cfg_get(cfg, "reward_kwargs")`), or the
    constant end of a key built by concatenation (`ROLL + "n"`, as rules and derive spell keys), a
    `*_key` argument of a registry declaration (`@ROLES.register(..., keep_key="trainer.max_actor_ckpt_to_keep")`),
    unless that key is the target of derive's `put` (filling a key in is not reading it). Known
    blind spot: keys sharing a last segment (`n`, `path`) pass when either is read. The test fails
    today for a key that is only declared (e.g. a new schema line no code reads)."""
    unread = unread_keys(SCHEMA.values(), read_names())
    assert unread == [], "read these keys in code, or mark them noop=/off_only= with the reason in the schema"
    for key in VERL_ONLY.values():
        assert key.noop or (key.off_only and key.instead), key.path


def unread_keys(keys, reads) -> list[str]:
    """Full paths of the keys that are neither read (by last segment) nor marked noop / off_only."""
    return [k.path for k in keys if not (k.off_only or k.noop) and k.path.rsplit(".", 1)[-1] not in reads]


def test_the_walk_fails_for_a_key_no_code_reads():
    """The walk can fail: a declared key that nothing reads is reported, and marking it as a no-op
    (with its reason) or as refused unless off clears it."""
    from dataclasses import replace

    from verl_npu.config.schema import BOOL, Key

    reads = read_names()
    assert {"reward_kwargs", "tensorboard_dir", "dataloader_num_workers"} <= set(reads)
    declared_only = Key("backend_config.data.shiny_new_switch", False, BOOL, "A key only declared.")
    assert unread_keys([declared_only], reads) == ["backend_config.data.shiny_new_switch"]
    assert unread_keys([replace(declared_only, noop="why it changes nothing")], reads) == []
    assert unread_keys([replace(declared_only, off_only="shiny switches")], reads) == []
    # a key verl-npu does not implement is read nowhere and refused unless off (issue 9's remedy; until
    # issue 39 enable_activation_offload was such a key, now it is read)
    assert "use_liger" not in reads and "enable_activation_offload" in reads
    assert SCHEMA["backend_config.actor_rollout_ref.model.use_liger"].off_only


# ------------------------------------------------------------------ one-way imports in verl_npu/config
ORDER = [
    "schema",
    "schema_verl",
    "schema_deprecated",
    "tree",
    "overrides",
    "modelinfo",
    "key_checks",
    "rules",
    "rules_vllm",
    "rules_roles",
    "rules_profiler",
    "rules_dapo",
    "rules_distill",
    "paths",
    "derive",
    "recipes",
    "sft_schema",
    "section_base",
    "sections",
    "typed",
    "loader",
    "sft",
    "stages",
    "reference",
    "compat",
    "sections_gen",
]


def _module_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "verl_npu.config":
                names |= {a.name for a in node.names}
            elif node.module.startswith("verl_npu.config."):
                names.add(node.module.rsplit(".", 1)[-1])
        elif isinstance(node, ast.Import):
            names |= {a.name.rsplit(".", 1)[-1] for a in node.names if a.name.startswith("verl_npu.config.")}
    return names & set(ORDER)


def test_config_modules_import_one_way_in_the_documented_order():
    import verl_npu.config as pkg

    doc = pkg.__doc__
    assert all(name.split(".")[-1] in doc for name in ORDER)
    files = {name: REPO / "verl_npu" / "config" / f"{name}.py" for name in ORDER}
    for name, path in files.items():
        for dep in _module_imports(path):
            assert ORDER.index(dep) < ORDER.index(name), f"{name} imports {dep}, which comes after it"


@pytest.mark.parametrize(
    "module",
    [f"verl_npu.config.{m}" for m in ORDER]
    + ["verl_npu.memory.plan", "verl_npu.memory.settings", "verl_npu.memory.recipe", "verl_npu.memory.budget"],
)
def test_each_config_module_imports_fresh_without_torch(module):
    code = f"import sys, {module}; assert 'torch' not in sys.modules, 'torch imported'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr


# ------------------------------------------------------------------ the generated compatibility table
def test_verl_compat_doc_is_in_sync():
    doc = (REPO / "docs" / "verl_compat.md").read_text()
    assert doc == render_compat(), "regenerate: python -m verl_npu.config.compat > docs/verl_compat.md"
    for needle in (
        "`actor_rollout_ref.rollout.data_parallel_size` | refused",
        "`critic.*` | refused",
        "`critic.cliprange_value` | supported",
        "`trainer.use_legacy_worker_impl` | no-op here",
        "`data.train_batch_size` | supported",
    ):
        assert needle in doc
