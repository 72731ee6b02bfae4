"""Stopping a run on a signal: what SIGTERM and Ctrl-C do (docs/reliability.md).

- SIGTERM (what ModelArts, Slurm and Kubernetes send to preempt a job): during training the step
  in progress is finished, a checkpoint is saved (`trainer.save_on_preempt`, default true) and
  the run exits 143 with a message naming the checkpoint; before the first step (loading,
  validation before training) it stops at once, also 143. Further SIGTERMs are ignored: a
  scheduler and a launcher may both send one.
- SIGINT (Ctrl-C): during training the first does what SIGTERM does (the step in progress is
  finished, a checkpoint saved and named; exit 130) and says that a second Ctrl-C stops at once;
  the second stops at once (exit 130), the step in progress and every step after the last complete
  checkpoint dropped, which the run's message names. Before training (loading, validation before
  training) and during a SIGTERM stop, the first stops at once. Later Ctrl-Cs, while the run is
  already stopping, are ignored so that the workers and the output-folder lock are released cleanly.

The handlers are installed by `verl-npu run` (`handle_signals()`, main thread only); the trainer
loop only asks `stop_requested()` and says which phase it is in (`set_phase`). This module
imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

log = logging.getLogger("verl_npu")

#: phases: "startup" (signals stop at once), "training" (SIGTERM waits for the step's end),
#: "finishing" (the run is ending anyway: SIGTERM is noted, nothing interrupted)
_state: dict = {"phase": "startup", "signal": None, "interrupting": False}


class Preempted(BaseException):
    """The run stopped on a signal; `exit_code` is 128 + the signal number. A BaseException, like
    KeyboardInterrupt, so that no `except Exception` on the way swallows it."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def exit_code_for(signum: int) -> int:
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    if signum == signal.SIGINT:
        return "Ctrl-C (SIGINT)"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def stop_requested() -> int | None:
    """The signal that asked the run to stop after the current step, or None."""
    return _state["signal"]


def request_stop(signum: int = signal.SIGTERM) -> None:
    """Ask the loop to stop after the current step (what SIGTERM does; tests call it directly)."""
    if _state["signal"] is None:
        _state["signal"] = int(signum)


def set_phase(phase: str) -> None:
    assert phase in ("startup", "training", "finishing"), phase
    _state["phase"] = phase


def reset() -> None:
    _state.update(phase="startup", signal=None, interrupting=False)


def _note(text: str) -> None:
    # stderr directly: a handler may run while a log handler holds its lock in this thread
    try:
        print(f"[verl-npu] {text}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - a closed stderr must not turn a signal into a crash
        pass


def _on_sigterm(signum, _frame) -> None:
    name = signal_name(signum)
    if _state["signal"] is not None or _state["interrupting"]:
        _note(f"{name} received again: already stopping")
        return
    _state["signal"] = int(signum)
    phase = _state["phase"]
    if phase == "training":
        _note(
            f"{name} received: finishing the current step, then saving a checkpoint "
            f"(trainer.save_on_preempt) and stopping"
        )
    elif phase == "finishing":
        _note(f"{name} received while the run is finishing: completing the shutdown")
    else:
        raise Preempted(f"stopped by {name} before training started: nothing new to save", exit_code_for(signum))


def _on_sigint(signum, _frame) -> None:
    if _state["interrupting"]:
        _note(f"Ctrl-C again: already stopping (cleaning up the workers); kill -9 {os.getpid()} forces it")
        return
    if _state["phase"] == "training" and _state["signal"] is None:
        _state["signal"] = int(signum)
        _note(
            "Ctrl-C: finishing the current step, then saving a checkpoint and stopping. "
            "Press Ctrl-C again to stop at once (the step in progress and the steps since the last "
            "checkpoint are then lost)"
        )
        return
    _state["interrupting"] = True
    if _state["signal"] == signal.SIGINT:
        _note("Ctrl-C again: stopping at once, without finishing the step or saving")
    elif _state["signal"] is not None:
        _note("Ctrl-C during a graceful stop: dropping the current step instead of finishing it")
    raise KeyboardInterrupt


@contextlib.contextmanager
def handle_signals():
    """Install the SIGTERM / SIGINT handlers of this module for the duration (a no-op outside the
    main thread, where Python cannot install handlers); the previous handlers come back after."""
    reset()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        reset()


@contextlib.contextmanager
def sigterm_blocked():
    """Block SIGTERM and SIGINT in this thread for the duration (for starting Ray). Processes
    started meanwhile (Ray's daemons and, through them, the Ray workers) inherit the blocked
    signals, so a SIGTERM sent to the whole process group or job, or a terminal's Ctrl-C (sent to
    the foreground process group), reaches only this controller, which then stops the run in order;
    a signal that arrives meanwhile is delivered when the block ends.

    `ray.init` also replaces this process's SIGTERM handler (with `sys.exit`, and a C-level one
    that prints a stack): the handlers in place before are put back before the block ends."""
    main = threading.current_thread() is threading.main_thread()
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    blocking = hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT}) if blocking else None
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if blocking:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
