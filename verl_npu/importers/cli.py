"""The `verl-npu import` command's output: the key table, the recipe written, what to do next, and
the loader's verdict (exit 0 when the recipe validates, 1 when it does not or nothing was written)."""

from __future__ import annotations

from collections.abc import Callable

from verl_npu.importers import import_to
from verl_npu.importers.output import table_text


def run_import(system: str, config: str, output: str | None, say: Callable[[str], None]) -> int:
    result, out = import_to(system, config, output)
    say(table_text(result))
    say("")
    if result.refused:
        say(f"no recipe written: {result.refused}")
        return 1
    say(f"wrote {out}" + "".join(f"\nwrote {out.with_name(out.stem + '.' + s)}" for s in result.extra_files))
    for note in result.notes:
        say(f"next: {note}")
    if result.validated:
        say(
            f"the recipe validates (verl-npu validate {out}); check data and model paths with "
            f"`verl-npu validate {out} --check-paths`"
        )
        return 0
    say(f"the recipe does not validate yet; {len(result.problems)} thing(s) to fix in {out}:")
    for p in result.problems:
        say("  - " + p.replace("\n", "\n    "))
    return 1
