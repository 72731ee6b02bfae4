"""What verl-npu does with each of upstream verl's config keys, and docs/verl_compat.md rendered from it.

`status(key)` answers for one key (verl's short form or the full path); `render_compat()` writes the
whole table from the schema (`schema.SCHEMA`, `schema_verl`), so the document cannot drift from what
`load_recipe` does. Regenerate with:

    python -m verl_npu.config.compat > docs/verl_compat.md

(tests/config/test_config_compat.py fails when the file is out of date.)
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_npu.config.schema import DICT, SCHEMA, Key
from verl_npu.config.schema_deprecated import DEPRECATED, DEPRECATED_MAPPED, DEPRECATED_WARN_ONLY, UNSUPPORTED_PREFIXES
from verl_npu.config.schema_verl import (
    ALIASES,
    OLDER_VERL,
    READ_WITH_PLUS,
    REFUSED_SUBTREES,
    TARGET_NOOP,
    VERL_ONLY,
    is_target,
    refused_subtree,
)
from verl_npu.config.tree import expand_key, scalar

SUPPORTED, NOOP, REFUSED, DEPRECATED_KIND, UNKNOWN = "supported", "no-op here", "refused", "deprecated", "unknown"


@dataclass(frozen=True)
class Status:
    """What verl-npu does with one key: `kind` (supported / no-op here / refused / deprecated /
    unknown) and the text a user reads (why, and what to do instead)."""

    kind: str
    text: str


def _refused_values(key: Key) -> str:
    if key.off_only:
        off = "`null` / `false`" if key.default is None else f"`{scalar(key.default)}`"
        return f"only {off} accepted ({key.off_only}: not supported yet)" + (
            f"; instead: {key.instead}" if key.instead else ""
        )
    return ""


def status(name: str) -> Status:
    """The status of one verl key (short `data.x` or full `backend_config.data.x`); a key verl 0.9.1's
    schema does not have (or does not declare) says so."""
    path = expand_key(name)
    found = _status(path)
    if found.kind == UNKNOWN:
        return found
    for table, words in (
        (OLDER_VERL, "a key of verl before 0.9.1; in 0.9.1: "),
        (READ_WITH_PLUS, "set with `+` in verl 0.9.1, read by "),
    ):
        hit = next((p for p in table if path == p or path.startswith(p + ".")), None)
        if hit:
            return Status(found.kind, f"{found.text} ({words}{table[hit]})")
    return found


def _status(path: str) -> Status:
    key = SCHEMA.get(path)
    if key is not None:
        if key.off_only:
            return Status(REFUSED, _refused_values(key))
        if key.noop:
            return Status(NOOP, key.noop)
        # verl-npu's own keys (an extension of verl's schema) say so at the start of their meaning
        text = (
            "verl-npu's own key (an extension: verl has no such key)"
            if key.doc.startswith("verl-npu:")
            else "read by verl-npu"
        )
        if key.unsupported:
            text += "; values not supported yet: " + ", ".join(f"`{v}`" for v in key.unsupported)
        if key.renamed:
            text += "; verl's deprecated names refused: " + ", ".join(
                f"`{old}` (write `{new}`)" for old, new in key.renamed
            )
        if key.derived:
            text += f"; derived when unset: {key.derived}"
        return Status(SUPPORTED, text)
    if path in ALIASES:
        return Status(SUPPORTED, f"read as `{ALIASES[path].removeprefix('backend_config.')}`")
    key = VERL_ONLY.get(path)
    if key is not None:
        if key.noop:
            extra = ("; refused values: " + ", ".join(f"`{v}`" for v in key.unsupported)) if key.unsupported else ""
            return Status(NOOP, key.noop.rstrip(".") + extra)
        return Status(REFUSED, _refused_values(key))
    if is_target(path) and path.startswith("backend_config."):
        return Status(NOOP, TARGET_NOOP)
    if path in DEPRECATED_MAPPED:
        return Status(DEPRECATED_KIND, f"accepted (verl 0.9.1 still reads it): {DEPRECATED_MAPPED[path]}")
    if path in DEPRECATED:
        return Status(
            DEPRECATED_KIND,
            f"no longer read by verl 0.9.1, refused: use `{DEPRECATED[path].removeprefix('backend_config.')}`",
        )
    if path in DEPRECATED_WARN_ONLY:
        return Status(DEPRECATED_KIND, f"accepted with a warning: {DEPRECATED_WARN_ONLY[path]}")
    hit = refused_subtree(path)
    if hit:
        what, instead = hit[1]
        return Status(REFUSED, f"{what} not supported yet (null/false accepted); instead: {instead}")
    for prefix, what in UNSUPPORTED_PREFIXES.items():
        if path == prefix or path.startswith(prefix + "."):
            return Status(REFUSED, f"{what} not supported yet (null/false accepted)")
    parent = _dict_parent(path)
    if parent is not None:
        inner = _status(parent)
        return Status(inner.kind, f"inside the free-form `{parent.removeprefix('backend_config.')}`: {inner.text}")
    return Status(UNKNOWN, "not a verl-npu or verl key")


def _dict_parent(path: str) -> str | None:
    """The nearest enclosing key of type dict (its contents pass through unchecked), or None."""
    parts = path.split(".")
    for end in range(len(parts) - 1, 0, -1):
        key = SCHEMA.get(".".join(parts[:end]))
        if key is not None:
            return key.path if key.type == DICT else None
    return None


def _section(short: str) -> str:
    parts = short.split(".")
    if parts[0] == "actor_rollout_ref" and len(parts) > 2:
        return ".".join(parts[:2])
    return parts[0]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows() -> list[tuple[str, str, Status]]:
    """(section, key or `prefix.*`, status) for every key the schema knows, sorted by section."""
    names: list[str] = []
    names += [
        p for p in SCHEMA if p.startswith("backend_config.") or p.startswith("engine_kwargs") or p == "af_output_dir"
    ]
    names += list(ALIASES) + list(VERL_ONLY) + list(DEPRECATED_MAPPED) + list(DEPRECATED) + list(DEPRECATED_WARN_ONLY)
    out = [
        (_section(n.removeprefix("backend_config.")), f"`{n.removeprefix('backend_config.')}`", status(n))
        for n in dict.fromkeys(names)
    ]
    prefixes = dict.fromkeys(list(REFUSED_SUBTREES) + list(UNSUPPORTED_PREFIXES))
    out += [
        (_section(p.removeprefix("backend_config.")), f"`{p.removeprefix('backend_config.')}.*`", status(p + ".any"))
        for p in prefixes
    ]
    order = {s: i for i, s in enumerate(dict.fromkeys(r[0] for r in out))}
    return sorted(out, key=lambda r: order[r[0]])


def render_compat() -> str:
    """docs/verl_compat.md as markdown."""
    out = [
        "# verl config compatibility",
        "",
        "Generated from `verl_npu/config/schema.py` and `verl_npu/config/schema_verl.py` by",
        "`python -m verl_npu.config.compat > docs/verl_compat.md`. Do not edit by hand.",
        "",
        "What verl-npu does with each key of upstream verl's `ppo_trainer` config (keys in verl's",
        "short form; in a recipe they live under `backend_config.`):",
        "",
        "- **supported**: read by verl-npu (some under another name: a verl alias);",
        "- **no-op here**: accepted at any valid value; it changes nothing in verl-npu, for the reason given;",
        "- **refused**: accepted only at its off value; anything else stops `validate` / `run` with an error",
        "  naming the missing feature and what to do instead (`prefix.*` rows: a whole verl feature);",
        "- **deprecated**: verl's own deprecations: those verl 0.9.1 still reads are mapped onto the new key",
        "  as verl maps them, with a warning naming both; the others are refused, naming the key that replaces them.",
        "",
        "`_target_` keys anywhere are no-ops (" + TARGET_NOOP + "). A key in none of these",
        "rows is not a verl key: it is reported as unknown, with a did-you-mean hint. One added with Hydra's `+`",
        "(`+key=value`) is ignored instead, listed in one warning at start and at the end of the run's",
        "`exp-config.yaml`; `verl-npu validate --strict` refuses it.",
        "",
    ]
    section = None
    for sec, name, st in rows():
        if sec != section:
            section = sec
            out += [f"## {sec}", "", "| key | status | why / what instead |", "|---|---|---|"]
        out.append(f"| {name} | {st.kind} | {_cell(st.text)} |")
    out.append("")
    text = "\n".join(out)
    return text.replace("|\n## ", "|\n\n## ") + ("" if text.endswith("\n") else "\n")


if __name__ == "__main__":
    import sys

    sys.stdout.write(render_compat())
