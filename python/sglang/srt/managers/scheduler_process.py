"""The scheduler's own process: receive requests, run ``Scheduler.step()``, send tokens back."""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from typing import Any

import zmq

from sglang.srt.managers.io_struct import (
    AbortRequest,
    BatchOutput,
    RequestOutput,
    RpcRequest,
    RpcResponse,
    TokenizedRequest,
)
from sglang.srt.managers.req import Req
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 500


@dataclass
class SchedulerReady:
    context_length: int
    max_total_tokens: int
    is_multimodal: bool
    model_type: str


class SchedulerLoop:
    def __init__(self, scheduler: Scheduler, args: ServerArgs, recv: zmq.Socket, send: zmq.Socket):
        self.scheduler = scheduler
        self.args = args
        self.recv = recv
        self.send = send
        self.sent: dict[str, int] = {}  # rid -> tokens already sent

    def run_forever(self, parent_pid: int) -> None:
        while True:
            self._receive(block=not self.scheduler.has_work)
            if os.getppid() != parent_pid:
                logger.warning("parent process is gone; scheduler exits")
                return
            if self.scheduler.has_work:
                self._emit(self.scheduler.step().reqs)

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
            try:
                req = self.scheduler.add_request(msg)
            except ValueError as exc:
                self._send_error(msg, str(exc))
                return
            self.sent[req.rid] = 0
        elif isinstance(msg, AbortRequest):
            if self.scheduler.abort(msg.rid):
                logger.info("aborted request %s", msg.rid)
            self.sent.pop(msg.rid, None)
        elif isinstance(msg, RpcRequest):
            self.send.send_pyobj(self._rpc(msg))

    def _rpc(self, msg: RpcRequest) -> RpcResponse:
        from sglang.srt.entrypoints.engine import server_info

        try:
            if msg.method == "server_info":
                return RpcResponse(msg.call_id, server_info(self.args, self.scheduler))
            if msg.method == "flush_cache":
                return RpcResponse(msg.call_id, self.scheduler.flush_cache())
            if msg.method == "check_integrity":
                self.scheduler.check_integrity()
                return RpcResponse(msg.call_id, True)
            return RpcResponse(msg.call_id, error=f"unknown method {msg.method}")
        except AssertionError as exc:
            return RpcResponse(msg.call_id, error=f"integrity check failed: {exc}")

    def _emit(self, reqs: list[Req]) -> None:
        outputs = []
        for req in reqs:
            if req.rid not in self.sent:
                continue  # aborted meanwhile
            start = self.sent[req.rid]
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
                )
            )
            if req.finished:
                del self.sent[req.rid]
            else:
                self.sent[req.rid] = len(req.output_ids)
        if outputs:
            self.send.send_pyobj(BatchOutput(outputs))

    def _send_error(self, msg: TokenizedRequest, message: str) -> None:
        reason = {"type": "abort", "message": message, "status_code": 400}
        out = RequestOutput(msg.rid, [], [], reason, len(msg.input_ids), 0, 0)
        self.send.send_pyobj(BatchOutput([out]))


def run_scheduler_process(
    args: ServerArgs, model_path: str, recv_addr: str, send_addr: str, ready_pipe: Any
) -> None:
    """Process entry point: build the engine side, report readiness, loop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API process decides when we stop
    logging.basicConfig(
        level=args.log_level.upper(), format="[%(asctime)s scheduler] %(levelname)s %(message)s"
    )
    parent_pid = os.getppid()
    try:
        import torch

        from sglang.srt.model_executor.model_runner import ModelRunner

        if args.random_seed is not None:
            torch.manual_seed(args.random_seed)
        runner = ModelRunner(args, model_path)
        scheduler = Scheduler(args, runner, runner.tokenizer)
        ctx = zmq.Context()
        recv = ctx.socket(zmq.PULL)
        recv.bind(recv_addr)
        send = ctx.socket(zmq.PUSH)
        send.connect(send_addr)
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
    SchedulerLoop(scheduler, args, recv, send).run_forever(parent_pid)
