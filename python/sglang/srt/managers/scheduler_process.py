"""The scheduler's own process: receive requests, run ``Scheduler.step()``, send tokens back."""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from sglang.srt.core.io_struct import (
    AbortRequest,
    BatchOutput,
    RequestOutput,
    RpcRequest,
    RpcResponse,
    SchedulerReady,
    TokenizedRequest,
)
from sglang.srt.core.req import Req
from sglang.srt.managers.gc_monitor import GcMonitor, freeze_after_start
from sglang.srt.managers.scheduler import RequestFailed, Scheduler
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 500
HELD_POLL_S = 0.005
PARENT_POLL_S = 0.5
PR_SET_PDEATHSIG = 1


class SchedulerLoop:
    def __init__(self, scheduler: Scheduler, recv: zmq.Socket, send: zmq.Socket) -> None:
        self.scheduler = scheduler
        self.recv = recv
        self.send = send
        self.sent: dict[str, int] = {}  # rid -> tokens already sent
        self.step_started: float | None = None  # monotonic time of the step in progress
        self.held: list[Req] = []  # ended requests whose KV pages are still being stored

    def run_forever(self) -> None:
        while True:
            if self.held:
                self._release_held(wait=not self.scheduler.has_work)
            self._receive(block=not self.scheduler.has_work and not self.held)
            if self.scheduler.has_work:
                self.step_started = time.monotonic()
                try:
                    reqs = self.scheduler.step().reqs
                except Exception:
                    logger.exception("scheduler step failed outside any single request; exiting")
                    self._fail_all("the scheduler failed; the server is shutting down")
                    raise
                self.step_started = None
                self._emit(reqs)

    def _receive(self, block: bool) -> None:
        if block and not self.recv.poll(IDLE_POLL_MS):
            return
        while True:
            try:
                msg = self.recv.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(msg)

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, TokenizedRequest):
            if msg.rid in self.sent:
                self._send_error(msg, f"request id {msg.rid!r} is already running")
                return
            try:
                req = self.scheduler.add_request(msg)
            except ValueError as exc:
                self._send_error(msg, str(exc))
                return
            except RequestFailed as exc:
                self._send_error(msg, str(exc), status_code=500)
                return
            except Exception as exc:
                logger.exception("admitting request %s failed", msg.rid)
                self._send_error(msg, f"internal error: {exc}", status_code=500)
                return
            self.sent[req.rid] = 0
        elif isinstance(msg, AbortRequest):
            if self.scheduler.abort(msg.rid):
                logger.info("aborted request %s", msg.rid)
            self.sent.pop(msg.rid, None)
        elif isinstance(msg, RpcRequest):
            self.send.send_pyobj(self._rpc(msg))

    def _fail_all(self, message: str) -> None:
        outputs = [RequestOutput.failed(rid, message, 503) for rid in self.sent]
        if outputs:
            self.send.send_pyobj(BatchOutput(outputs))

    def _rpc(self, msg: RpcRequest) -> RpcResponse:
        try:
            if msg.method == "server_info":
                return RpcResponse(msg.call_id, self.scheduler.info())
            if msg.method == "load":  # what /get_load answers, without the rest of server_info
                return RpcResponse(msg.call_id, self.scheduler.load())
            if msg.method == "flush_cache":
                return RpcResponse(msg.call_id, self.scheduler.flush_cache())
            if msg.method in ("pause_generation", "continue_generation"):
                self.scheduler.paused = msg.method == "pause_generation"
                return RpcResponse(msg.call_id, True)
            if msg.method == "check_integrity":
                self.scheduler.check_integrity()
                return RpcResponse(msg.call_id, True)
            return RpcResponse(msg.call_id, error=f"unknown method {msg.method}")
        except AssertionError as exc:
            return RpcResponse(msg.call_id, error=f"integrity check failed: {exc}")
        except Exception as exc:
            logger.exception("control call %s failed", msg.method)
            return RpcResponse(msg.call_id, error=f"{msg.method} failed: {exc}")

    def _release_held(self, wait: bool) -> None:
        """Emit the held requests whose pages are stored (with ``wait``: nap for them first)."""
        hicache = self.scheduler.hicache
        assert hicache is not None
        if wait:
            hicache.wait_persisted(self.held[:1], HELD_POLL_S)
        ready, self.held = _split(self.held, hicache.persisted)
        if ready:
            self._emit(ready)

    def _emit(self, reqs: list[Req]) -> None:
        hicache = self.scheduler.hicache
        if hicache is not None:
            reqs, waiting = _split(reqs, lambda r: not r.finished or hicache.persisted(r))
            self.held += waiting
        outputs = []
        for req in reqs:
            if req.rid not in self.sent:
                continue  # aborted meanwhile
            start = self.sent[req.rid]
            with_prompt = start == 0 and req.wants_prompt_logprobs
            outputs.append(
                RequestOutput(
                    rid=req.rid,
                    new_token_ids=req.output_ids[start:],
                    new_logprobs=req.output_logprobs[start:],
                    finish_reason=req.finish_reason,
                    prompt_tokens=len(req.input_ids),
                    cached_tokens=req.cached_len,
                    completion_tokens=len(req.output_ids),
                    new_top_logprobs=req.output_top_logprobs[start:],
                    input_logprobs=req.input_logprobs if with_prompt else None,
                    input_top_logprobs=req.input_top_logprobs if with_prompt else None,
                    new_token_ids_logprobs=req.output_token_ids_logprobs[start:],
                    input_token_ids_logprobs=req.input_token_ids_logprobs if with_prompt else None,
                    mm_items=req.mm_report() if req.finished and req.mm_items else None,
                    embedding=req.embedding if req.finished else None,
                )
            )
            if req.finished:
                del self.sent[req.rid]
            else:
                self.sent[req.rid] = len(req.output_ids)
        if outputs:
            self.send.send_pyobj(BatchOutput(outputs))

    def _send_error(self, msg: TokenizedRequest, message: str, status_code: int = 400) -> None:
        out = RequestOutput.failed(msg.rid, message, status_code, len(msg.input_ids))
        self.send.send_pyobj(BatchOutput([out]))


def _split(reqs: list[Req], keep: Callable[[Req], bool]) -> tuple[list[Req], list[Req]]:
    """(those ``keep`` accepts, the others), in order."""
    kept, other = [], []
    for req in reqs:
        (kept if keep(req) else other).append(req)
    return kept, other


def run_scheduler_process(
    args: ServerArgs, model_path: str, recv_addr: str, send_addr: str, ready_pipe: Any
) -> None:
    """Process entry point: build the engine side, report readiness, loop. Exits when the
    parent process is gone (at once, even mid-forward) or a step outlives the watchdog."""
    logging.basicConfig(
        level=args.log_level.upper(), format="[%(asctime)s scheduler] %(levelname)s %(message)s"
    )
    parent_pid = os.getppid()
    _die_with_parent(parent_pid)
    try:
        import torch

        from sglang.srt.model_executor.model_runner import ModelRunner

        if args.random_seed is not None:
            torch.manual_seed(args.random_seed)
        runner = ModelRunner(args, model_path)
        scheduler = Scheduler(args, runner, runner.tokenizer)
        scheduler.gc_monitor = GcMonitor(args.gc_warning_threshold_secs)
        ctx = zmq.Context()
        recv = ctx.socket(zmq.PULL)
        recv.bind(recv_addr)
        send = ctx.socket(zmq.PUSH)
        send.connect(send_addr)
        freeze_after_start()
    except Exception as exc:
        logger.exception("scheduler failed to start")
        ready_pipe.send(exc)
        return
    ready_pipe.send(
        SchedulerReady(
            runner.context_length,
            runner.max_total_tokens,
            runner.is_multimodal,
            runner.config.model_type,
        )
    )
    loop = SchedulerLoop(scheduler, recv, send)
    threading.Thread(
        target=_watchdog, args=(loop, parent_pid, args.watchdog_timeout), daemon=True
    ).start()
    try:
        loop.run_forever()
    except Exception:
        send.close(linger=2000)  # let the error outputs leave before the process ends
        sys.exit(1)


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill this process when its parent dies (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # the watchdog thread still notices the parent's death
    if os.getppid() != parent_pid:
        os._exit(1)


def _watchdog(loop: SchedulerLoop, parent_pid: int, timeout: float) -> None:
    """Exit when the parent is gone or one step has run longer than ``timeout`` seconds (a
    wedged forward): the API process then fails in-flight requests and exits, and a
    supervisor can restart the server."""
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(1)
        started = loop.step_started
        if started is not None and time.monotonic() - started > timeout:
            logger.error("a scheduler step has run for over %.0f s; exiting", timeout)
            faulthandler.dump_traceback(all_threads=True)
            os._exit(1)
