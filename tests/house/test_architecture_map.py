"""docs/architecture.md is a map of the package: it names every module under verl_npu/ (as `path/to/module.py`
relative to verl_npu/, in its "Module map") and every extension point's registry."""

from __future__ import annotations

from pathlib import Path

from verl_npu import registry

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"


def test_every_module_is_named_in_the_architecture_map():
    text = DOC.read_text(encoding="utf-8")
    modules = sorted(p.relative_to(REPO / "verl_npu") for p in (REPO / "verl_npu").rglob("*.py"))
    assert len(modules) > 100
    missing = [str(m) for m in modules if f"`{m}`" not in text]
    assert missing == [], (
        "modules docs/architecture.md does not name (add a row `path` | what it is to its "
        "Module map): " + ", ".join(missing)
    )
    named = [
        line.split("`")[1]
        for line in text.splitlines()
        if line.startswith("| `") and line.split("`")[1].endswith(".py")
    ]
    gone = [n for n in named if not (REPO / n if n.startswith("verl_npu/") else REPO / "verl_npu" / n).exists()]
    assert gone == [], f"rows of modules that no longer exist: {gone}"


def test_every_extension_point_is_named():
    text = DOC.read_text(encoding="utf-8")
    for reg in registry.ALL:
        assert f"`{reg.handle}`" in text, reg.handle
        assert reg.key.startswith("(") or reg.key in text, reg.key  # roles are named by no key
