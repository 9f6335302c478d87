"""Schema-based fuzzing of the HTTP API: no generated request may produce a 5xx."""

from __future__ import annotations

import pytest
from conftest import examples, model_dir
from hypothesis import HealthCheck, given, settings
from server_utils import launch_server

schemathesis = pytest.importorskip("schemathesis")


@pytest.fixture(scope="module")
def fuzz_server():
    with launch_server(model_dir("qwen2_5_vl"), "--context-length", "256") as (url, _):
        yield url


def test_no_server_errors_under_fuzzing(fuzz_server):
    schema = schemathesis.openapi.from_url(f"{fuzz_server}/openapi.json")
    failures, calls = [], []
    for operation in schema.get_all_operations():
        op = operation.ok()
        if op.path in ("/flush_cache",):
            continue

        @settings(
            max_examples=examples(20),
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case) -> None:
            if isinstance(case.body, dict):
                params = case.body.get("sampling_params")
                if isinstance(params, dict):
                    params["max_new_tokens"] = 4
                for key in ("max_tokens", "max_completion_tokens"):
                    if key in case.body:
                        case.body[key] = 4
                if case.operation.path == "/v1/chat/completions":
                    case.body.setdefault("max_tokens", 4)  # else: up to the context length
            response = case.call(base_url=fuzz_server, timeout=60)
            calls.append((case.operation.path, response.status_code))
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.operation.path} -> {response.status_code}: "
                    f"{response.text[:300]} for {case.body!r:.300}"
                )

        given(op.as_strategy())(run)()
    assert not failures, "\n".join(failures[:10])
    paths = {path for path, _ in calls}
    assert {"/generate", "/v1/chat/completions", "/v1/completions"} <= paths
    per_path = {p: sum(1 for q, _ in calls if q == p) for p in paths}
    assert min(per_path[p] for p in ("/generate", "/v1/chat/completions")) >= 10, per_path
