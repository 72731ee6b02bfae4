"""Render docs/config_reference.md from the schema and the rules (`verl-npu explain --all`).

Regenerate with:  python -m verl_npu.config.reference > docs/config_reference.md
(tests/config/test_config_load.py fails when the file is out of date).
"""

from __future__ import annotations

from verl_npu.config.key_checks import range_text
from verl_npu.config.rules import RULES
from verl_npu.config.schema import SCHEMA, Key
from verl_npu.config.schema_deprecated import DEPRECATED, DEPRECATED_MAPPED, DEPRECATED_WARN_ONLY, UNSUPPORTED_PREFIXES
from verl_npu.config.tree import scalar as _scalar


def _section(key: Key) -> str:
    parts = key.short.split(".")
    if key.path == key.short:  # top level: af_output_dir, engine_kwargs.*
        return "top level"
    if parts[0] == "actor_rollout_ref" and len(parts) > 2:
        return f"actor_rollout_ref.{parts[1]}"
    return parts[0]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _notes(key: Key) -> str:
    notes = []
    if key.required:
        notes.append("**required**")
    if key.choices:
        notes.append("choices: " + ", ".join(f"`{c}`" for c in key.choices))
    if key.unsupported:
        notes.append("not supported yet: " + ", ".join(f"`{c}`" for c in key.unsupported))
    if key.renamed:
        notes.append(
            "verl's deprecated names, refused: " + ", ".join(f"`{old}` (write `{new}`)" for old, new in key.renamed)
        )
    if range_text(key):
        notes.append("range: " + range_text(key))
    if key.off_only:
        notes.append(f"only the default (no {key.off_only} yet)" + (f"; instead: {key.instead}" if key.instead else ""))
    if key.noop:
        notes.append(f"no effect here: {key.noop}")
    if key.derived:
        notes.append(f"derived when unset: {key.derived}")
    return "; ".join(notes)


def render_reference() -> str:
    """The whole config reference as markdown."""
    out = [
        "# verl-npu config reference",
        "",
        "Generated from `verl_npu/config/schema.py` and `verl_npu/config/rules.py` by",
        "`python -m verl_npu.config.reference > docs/config_reference.md` (same text as",
        "`verl-npu explain --all`). Do not edit by hand.",
        "",
        "Keys are written in verl's short form; in a recipe they live under `backend_config.`",
        "(except the top-level ones). On the command line both forms work:",
        "`data.train_batch_size=64` and `backend_config.data.train_batch_size=64`.",
        "A value starting with `EDIT_ME` is a placeholder and is refused.",
        "A key that is neither a verl-npu nor a verl key is refused, except one added with Hydra's `+`",
        "(`+key=value`): that one is ignored, listed in one warning at start and at the end of the run's",
        "`exp-config.yaml`; `verl-npu validate --strict` refuses it too.",
        "",
    ]
    sections: dict[str, list[Key]] = {}
    for key in SCHEMA.values():
        sections.setdefault(_section(key), []).append(key)
    for name, keys in sections.items():
        out += [f"## {name}", "", "| key | type | default | meaning | notes |", "|---|---|---|---|---|"]
        for k in keys:
            type_ = _cell(k.type + (" | null" if k.allows_null else ""))
            out.append(
                f"| `{k.short}` | {type_} | `{_cell(_scalar(k.default))}` | {_cell(k.doc)} | {_cell(_notes(k))} |"
            )
        out.append("")
    out += [
        "## Deprecated verl keys",
        "",
        "Those verl 0.9.1 still reads are accepted and mapped as verl maps them, with a warning naming both:",
        "",
    ]
    out += [f"- `{old.removeprefix('backend_config.')}`: {how}" for old, how in DEPRECATED_MAPPED.items()]
    out += ["", "Those verl 0.9.1 no longer reads are errors:", ""]
    out += [
        f"- `{old.removeprefix('backend_config.')}`: use `{new.removeprefix('backend_config.')}`"
        for old, new in DEPRECATED.items()
    ]
    out += [
        f"- `{old.removeprefix('backend_config.')}`: only a warning; {why}" for old, why in DEPRECATED_WARN_ONLY.items()
    ]
    out += ["", "## verl sections not supported yet (errors unless null/false)", ""]
    out += [f"- `{p.removeprefix('backend_config.')}.*`: {what}" for p, what in UNSUPPORTED_PREFIXES.items()]
    out += [
        "",
        "## Cross-key rules",
        "",
        "Checked before anything heavy starts; every problem is reported at once.",
        "",
    ]
    out += [f"- **{r.name}**: {r.text}" for r in RULES]
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    sys.stdout.write(render_reference())
