# SPDX-License-Identifier: Apache-2.0
"""A script using ``vllm.LLM`` exits promptly: two fixes for what its exit used to wait on.

**The engine core's SIGTERM.** vLLM shuts an engine-core process down with SIGTERM and SIGKILLs it
5 s later (``vllm/v1/utils.py:shutdown``). Its handler is Python, which CPython runs on the main
thread only; that thread sleeps in ``input_queue.get()`` without a timeout
(``vllm/v1/engine/core.py:_process_input_queue``) and only the handler would wake it. Linux gives a
process-directed signal to any thread not blocking it, and the signal often lands on the engine
core's output thread, on a CPU just then because it sent the output that made the script shut
down (strace: ``--- SIGTERM ---`` on that thread's tid; a ``tgkill`` to the main thread ends the
process at once). The handler stays pending until the SIGKILL. Fix, installed by the worker in the
engine core's main thread: a wakeup fd sees every delivery (CPython writes to it from whichever
thread took the signal) and a small thread re-sends the signal to the main thread every
:data:`GRACE` s until vLLM's handler has run. Only in vLLM's engine-core process (an in-process
engine has no such handler) and when no other wakeup fd is set; ``TT_VLLM_FORWARD_SIGNALS=0``
turns it off.

**The last garbage collection.** At exit CPython scans the whole heap for cycles once more; with
vLLM, torch and transformers loaded that took 4-5 s (py-spy: ``gc_collect_main`` under
``Py_FinalizeEx``). Nothing needs it then (vLLM's own exit hook shuts the engines down; finalizers
of cyclic garbage are not guaranteed at exit anyway), so the front end freezes the heap in an exit
hook, as vLLM's engine core does on ROCm. Not where ttnn is loaded (an engine in the script's own
process): its bindings report every object left uncollected as a leak. ``TT_VLLM_FREEZE_AT_EXIT=0``
turns it off.

**The server's engine core.** ``vllm serve`` ends its engine core with no grace at all by default
(:func:`grant_engine_core_grace`), and logs its own orderly shutdown as a dead engine
(:func:`quiet_engine_dead_at_shutdown`).
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from loguru import logger

from models.common import envs

FORWARD_ENV = "TT_VLLM_FORWARD_SIGNALS"
FREEZE_ENV = "TT_VLLM_FREEZE_AT_EXIT"
SIGNALS = (signal.SIGTERM, signal.SIGINT)
ENGINE_CORE_MODULE = "vllm.v1.engine.core"  # where vLLM's engine-core signal handler is defined
GRACE = 0.1  # seconds the main thread has to run the handler before the signal is sent to it again
MAX_FORWARDS = 30  # 3 s, below vLLM's 5 s before SIGKILL; a forward landing just before the wait is retried


class SignalForwarder:
    """Watches the wakeup fd; until vLLM's handler has run, re-sends the signal to the main thread.

    vLLM's engine-core handler always ends the engine (SIGTERM and SIGINT alike), so one run of
    it is all that is owed: after that the forwarder stops."""

    def __init__(self, read_fd: int, main_ident: int) -> None:
        self.read_fd = read_fd
        self.main_ident = main_ident
        self.handled = threading.Event()
        self.forwarded = 0

    def wrap(self, handler: Callable[[int, Any], Any]) -> Callable[[int, Any], Any]:
        def noted(signum: int, frame: Any) -> Any:
            self.handled.set()
            return handler(signum, frame)

        return noted

    def run(self) -> None:
        while not self.handled.is_set():
            try:
                data = os.read(self.read_fd, 64)
            except OSError:
                return
            if not data:
                return
            taken = [number for number in data if number in SIGNALS]
            if taken:
                self._forward(signal.Signals(taken[0]))

    def _forward(self, signum: signal.Signals) -> None:
        for _ in range(MAX_FORWARDS):
            if self.handled.wait(GRACE):
                return
            self.forwarded += 1
            if self.forwarded == 1:
                logger.info(f"engine core: {signum.name} not handled by the main thread after {GRACE} s; sent to it")
            signal.pthread_kill(self.main_ident, signum)


def install_signal_forwarding() -> SignalForwarder | None:
    """Install in vLLM's engine-core process, from its main thread; None where there is nothing to fix."""
    if not envs.TT_VLLM_FORWARD_SIGNALS or threading.current_thread() is not threading.main_thread():
        return None
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    if not all(callable(h) and getattr(h, "__module__", "") == ENGINE_CORE_MODULE for h in handlers.values()):
        return None
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if previous != -1:
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return None
    forwarder = SignalForwarder(read_fd, threading.main_thread().ident)
    for sig, handler in handlers.items():
        signal.signal(sig, forwarder.wrap(handler))
    threading.Thread(target=forwarder.run, name="tt-signal-forward", daemon=True).start()
    logger.debug("engine core: SIGTERM/SIGINT taken by another thread are forwarded to the main thread")
    return forwarder


# vLLM's own variable: how long its process manager lets an engine core exit after SIGTERM.
ENGINE_CORE_GRACE_ENV = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"
# An upper bound, not a wait: the manager stops waiting when the process has exited. Here (2 loaded
# cores) a served engine core took 6 s from SIGTERM to its exit (its final teardown with ttnn
# loaded), past vLLM's generic 5 s.
ENGINE_CORE_GRACE_S = 30


def grant_engine_core_grace() -> None:
    """``vllm serve`` by default (``--shutdown-timeout 0``: abort requests) gives its engine core
    no time at all: SIGTERM, then at once SIGKILL (``get_engine_process_shutdown_timeout`` returns
    0), and the front end logs the dead engine's ``EngineDeadError`` traceback on its way out.
    Requests are still aborted at once; only the process gets vLLM's usual window, through vLLM's
    own variable, unless the user set it."""
    os.environ.setdefault(ENGINE_CORE_GRACE_ENV, str(ENGINE_CORE_GRACE_S))


_client_shutting_down = threading.Event()
ASYNC_LLM_LOGGER = "vllm.v1.engine.async_llm"  # vLLM's logger names are its module names


def quiet_engine_dead_at_shutdown() -> None:
    """The server's own shutdown, not an engine failure, must not log one.

    On SIGINT/SIGTERM ``vllm serve`` shuts its engine client down (``MPClient.shutdown``), which
    cancels the task reading the engine core's outputs; that task reports the cancellation as an
    ``EngineDeadError`` to ``AsyncLLM``'s output handler, which logs "AsyncLLM output_handler
    failed." with its traceback on every clean exit. Marks the client's shutdown and drops exactly
    that record after it; an engine that dies while the client is serving is still logged.
    Idempotent; in vLLM's front end (where the platform checks the config)."""
    import logging

    from vllm.v1.engine.core_client import MPClient

    original = MPClient.shutdown
    if getattr(original, "tt_marks_shutdown", False):
        return

    def shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        _client_shutting_down.set()
        return original(self, *args, **kwargs)

    shutdown.tt_marks_shutdown = True
    MPClient.shutdown = shutdown
    logging.getLogger(ASYNC_LLM_LOGGER).addFilter(_not_engine_dead_at_shutdown)


def _not_engine_dead_at_shutdown(record: Any) -> bool:
    from vllm.v1.engine.exceptions import EngineDeadError

    error = record.exc_info[1] if record.exc_info else None
    return not (_client_shutting_down.is_set() and isinstance(error, EngineDeadError))


_freeze_registered = False


def freeze_heap_at_exit() -> bool:
    """Register :func:`freeze_heap` as an exit hook of this process (once). Exit hooks run in
    either order with vLLM's own (which shuts the engines down); freezing only makes the cycle
    scans that follow skip the heap."""
    global _freeze_registered
    if _freeze_registered or not envs.TT_VLLM_FREEZE_AT_EXIT:
        return _freeze_registered
    atexit.register(freeze_heap)
    _freeze_registered = True
    return True


def freeze_heap() -> bool:
    """``gc.freeze()``, unless ttnn is loaded here: its nanobind bindings would report each of its
    objects the final collection skips as leaked (vLLM's front end never loads it)."""
    if "ttnn" in sys.modules:
        return False
    gc.freeze()
    return True
