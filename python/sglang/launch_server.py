"""``python -m sglang.launch_server``: the HTTP server with the scheduler in its own process.

This module imports nothing heavy at its top: the scheduler process starts first and imports the
engine (torch, transformers) while this process parses the arguments, checks the model and
loads the tokenizer, so the two imports overlap."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import uuid
from typing import TYPE_CHECKING, Any

from sglang.srt.entrypoints.middleware import MAX_HEADER_BYTES, MAX_TARGET_BYTES
from sglang.srt.managers.compute_env import apply_compute_env_defaults
from sglang.srt.managers.gc_monitor import freeze_after_start

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

logger = logging.getLogger("sglang.launch_server")
FATAL_GRACE_S = 2.0


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server", description=__doc__)
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))


def launch_server(args: ServerArgs, scheduler: SchedulerProcess) -> None:
    from sglang.srt.entrypoints.default_model import resolve_model_path

    if args.encoder_only:
        scheduler.stop()  # the encoder runs in this process: stopped before it imports more
    logging.basicConfig(
        level=args.log_level.upper(), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s"
    )
    model_path = resolve_model_path(args.model_path)
    args = dataclasses.replace(args, model_path=model_path)
    logger.info(
        "server args: %s", {k: v for k, v in dataclasses.asdict(args).items() if k != "api_key"}
    )
    from sglang.srt.model_executor.memory import InsufficientMemoryError, check_launch
    from sglang.srt.models.adapters import UnsupportedModelError, check_model

    try:
        check_model(model_path, args.trust_remote_code)
        if not args.encoder_only:
            check_launch(args, model_path)  # before the scheduler starts loading weights
    except (UnsupportedModelError, InsufficientMemoryError) as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.encoder_only:
        _serve_encoder(args, model_path)
        return
    from sglang.srt.entrypoints.http_server import create_app
    from sglang.srt.managers.tokenizer_manager import TokenizerManager, load_processor

    processor = load_processor(args, model_path)
    ipc_dir = tempfile.mkdtemp(prefix="sglang-")
    tag = uuid.uuid4().hex[:8]
    addrs = (f"ipc://{ipc_dir}/to-scheduler-{tag}", f"ipc://{ipc_dir}/from-scheduler-{tag}")
    ready = scheduler.load(args, model_path, addrs)
    if isinstance(ready, Exception):
        raise SystemExit(f"scheduler failed to start: {ready}")
    manager = TokenizerManager(args, model_path, processor, ready, addrs, scheduler.proc)
    fatal = _serve(args, create_app(manager, args, warm_up=True), manager)
    if fatal is not None:
        raise SystemExit(f"server stopped: {fatal}")


class SchedulerProcess:
    """The scheduler's process, started before anything else: it imports the engine (seconds of
    torch and transformers) while the API process parses, checks and imports its own side. It
    loads nothing until ``load`` sends it the arguments and ends quietly when ``stop`` comes
    first (a refused model, an encoder-only worker). Leaving the context stops it."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        start_reader, self._start_writer = ctx.Pipe(duplex=False)
        self._ready_reader, ready_writer = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(
            target=_scheduler_main,
            args=(start_reader, ready_writer),
            daemon=True,
            name="sglang-scheduler",
        )
        self.proc.start()
        start_reader.close()
        ready_writer.close()  # only the child writes: a child that dies unannounced ends recv()

    def load(self, args: ServerArgs, model_path: str, addrs: tuple[str, str]) -> Any:
        """Send the arguments; return what the scheduler reports once its model is loaded
        (``SchedulerReady``) or the exception it failed with."""
        self._start_writer.send((args, model_path, *addrs))
        try:
            return self._ready_reader.recv()
        except EOFError:
            self.proc.join(timeout=5)
            return RuntimeError(f"the scheduler process exited with code {self.proc.exitcode}")

    def stop(self) -> None:
        self._start_writer.close()  # a scheduler still waiting for its arguments ends
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
            if self.proc.is_alive():
                self.proc.kill()

    def __enter__(self) -> SchedulerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _scheduler_main(start_pipe: Any, ready_pipe: Any) -> None:
    """The scheduler process's entry: import the engine, then wait for the arguments."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API process decides when we stop
    from sglang.srt.managers.scheduler_process import run_scheduler_process

    try:
        start = start_pipe.recv()
    except EOFError:
        return  # stopped before it loaded anything
    run_scheduler_process(*start, ready_pipe)


def _serve_encoder(args: ServerArgs, model_path: str) -> None:
    """An encoder-only worker: the vision tower behind POST /encode, in this process."""
    import uvicorn

    from sglang.srt.entrypoints.encode_server import create_encoder_app
    from sglang.srt.model_executor.encoder_runner import EncoderRunner

    try:
        runner = EncoderRunner(args, model_path)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    app = create_encoder_app(runner, args)
    logger.info("encoder-only worker on http://%s:%d", args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, http="h11")


def _serve(args: ServerArgs, app: Any, manager: Any) -> str | None:
    """Serve until shutdown; return the fatal error that stopped the server, if any."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_keep_alive=5,
        # h11 (not httptools, should it be installed): a head arriving in several reads is
        # refused past this size; one that arrives whole meets HeaderLimitMiddleware.
        http="h11",
        h11_max_incomplete_event_size=MAX_HEADER_BYTES + MAX_TARGET_BYTES,
        timeout_graceful_shutdown=FATAL_GRACE_S,
    )
    server = uvicorn.Server(config)

    def on_fatal(message: str) -> None:
        # In-flight requests already have their error; give the responses a moment to leave.
        asyncio.get_running_loop().call_later(FATAL_GRACE_S, setattr, server, "should_exit", True)

    manager.on_fatal = on_fatal
    freeze_after_start()
    server.run()
    return manager.fatal_error


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    apply_compute_env_defaults()  # the scheduler process, which starts next, inherits them
    with SchedulerProcess() as scheduler:
        launch_server(parse_args(argv), scheduler)


if __name__ == "__main__":
    main()
