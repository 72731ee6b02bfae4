"""Runs a data-prep module of verl_npu, or says in one line which Python to use instead.

`python data_prep/<name>.py` with a Python that lacks the project (the system one, a venv that is
not activated) would end in a ModuleNotFoundError traceback; this names the missing module and the
command that works.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def run(module: str) -> None:
    """Import ``module`` and call its ``main()``; exit 1 with one line when a package is missing."""
    script = Path(sys.argv[0])
    try:
        main = importlib.import_module(module).main
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        venv = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "python"
        hint = (f"run it with the project's Python: {venv} data_prep/{script.name} ..."
                if venv.exists() else
                "set up the project first (python3 -m venv .venv && .venv/bin/pip install -e .), then run "
                f".venv/bin/python data_prep/{script.name} ...")
        sys.exit(f"error: data_prep/{script.name}: this Python ({sys.executable}) cannot import {top!r}; "
                 f"{hint} (or activate the venv: source .venv/bin/activate)")
    main()
