"""Real ``offgraph-kv serve`` processes on free loopback ports, for the serve tests: each module
starts the servers it needs once (module-scoped fixtures) and they are stopped by SIGTERM at the
end, which must exit 0."""

from __future__ import annotations

import pytest

from .serve_helpers import Server


@pytest.fixture(scope="module")
def start_server():
    """``start_server(model, *args, api_key=None)``: a started server, stopped (and checked to
    exit 0) when the module is done."""
    started: list[Server] = []

    def start(model: str, *args: str, **kw) -> Server:
        s = Server(model, *args, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        rc = s.stop()
        assert rc == 0, f"server exited {rc}:\n{s.output()}"
