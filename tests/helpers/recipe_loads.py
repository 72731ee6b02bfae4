"""Many independent loads of one shipped recipe, each with its own overrides, spread over the machine's cores.

The absurd-values tests (tests/cli/test_faults_inputs.py) load a recipe about a thousand times; each load is
pure CPU and independent of the others, so on CI's two cores two processes halve the wall time. What a load
gave comes back as plain data: the assertions stay in the test.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any


def load_outcome(case: tuple[str, list[str], str | None]) -> tuple[str, Any]:
    """Load recipe `case[0]` with overrides `case[1]`: ("problems", [(key, message), ...]) when it is refused
    with ConfigErrors; ("crash", "Type: text") on any other exception; ("loaded", value) otherwise, the value
    at dotted path `case[2]` of the backend tree (None when no path is asked)."""
    from verl_npu.config import load_recipe
    from verl_npu.errors import ConfigErrors

    recipe, overrides, path = case
    try:
        rc = load_recipe(recipe, overrides)
    except ConfigErrors as e:
        return "problems", [(p.key, p.message) for p in e.problems]
    except Exception as exc:  # noqa: BLE001 - what the callers look for
        return "crash", f"{type(exc).__name__}: {exc}"
    got: Any = None
    if path is not None:
        got = rc.backend
        for part in path.split("."):
            got = got[part]
    return "loaded", got


def load_outcomes(cases: list[tuple[str, list[str], str | None]]) -> list[tuple[str, Any]]:
    """`load_outcome` of every case, in order, computed by one process per allowed core (spawned: a clean
    interpreter that imports only the config layer)."""
    workers = max(1, min(len(os.sched_getaffinity(0)), 4))
    if workers == 1:
        return [load_outcome(case) for case in cases]
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        return list(pool.map(load_outcome, cases, chunksize=max(1, len(cases) // (8 * workers))))
