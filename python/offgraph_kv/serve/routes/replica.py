"""What a router in front of several replicas asks each one (SMG, the SGLang router's successor,
and the vLLM router built from it): the replica's load, its server and model info, and a health
check that proves the stepping thread still answers.

* ``GET /v1/loads`` (``?include=...`` accepted and ignored): SGLang's load shape, one data-parallel
  rank (``dp_rank`` 0): running and waiting requests, cells in use by running requests
  (``num_used_tokens``, what SMG sums as a worker's load), cells held as prefix cache, the cache's
  size and ``token_usage`` (their ratio);
* ``GET /get_load``: the older routers' ``{"load": running + waiting, ...}``;
* ``GET /server_info``, ``/get_server_info`` and ``/model_info``, ``/get_model_info``: the served
  name and sizes a router labels the worker with (SMG asks the first, then the ``get_`` form);
* ``GET /health_generate``: 200 once the stepping thread has run a no-op between two steps
  (503 if it has died or does not answer in 10 s), where ``/health`` only reads the last figures.

Every figure is the last step's (:attr:`~..worker.RequestWorker.last_state`): a poll never waits
for a forward.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from ..server import Server

__all__ = ["load_figures", "register"]

HEALTH_GENERATE_TIMEOUT = 10.0


def load_figures(st: dict[str, Any], max_running: int) -> dict[str, Any]:
    """One rank's load, SGLang's field names, from the worker's occupancy figures ``st`` and
    the most requests the replica holds at once (``max_running``)."""
    total = max(int(st.get("cells_total", 0)), 1)
    used = int(st.get("cells_used", 0))
    cached = int(st.get("cells_cached", 0))
    # Cells of running requests: the prefix cache is reusable room, not load.
    busy = max(used - cached, 0)
    running, waiting = int(st.get("running", 0)), int(st.get("waiting", 0))
    return {
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_total_reqs": running + waiting,
        "num_used_tokens": busy,
        "num_cached_tokens": cached,
        "max_total_num_tokens": total,
        "token_usage": round(busy / total, 6),
        "max_running_requests": max_running,
    }


def register(app: FastAPI, srv: Server) -> None:
    """Adds the routes to ``app``, over ``srv``."""
    worker = srv.worker
    gen = worker.gen

    def figures() -> dict[str, Any]:
        return load_figures(worker.last_state, int(gen.n_seq_max))

    def server_info() -> dict[str, Any]:
        from ... import __version__

        return {
            "model_path": srv.model_name,
            "served_model_name": srv.model_name,
            "tp_size": 1,
            "dp_size": 1,
            "version": f"offgraph-kv {__version__}",
            "max_total_tokens": int(gen.n_cells),
            "max_prefill_tokens": int(gen.max_prefill_tokens),
            "max_running_requests": int(gen.n_seq_max),
            "max_batch_size": int(gen.n_seq_max),
            "load": figures(),
        }

    def model_info() -> dict[str, Any]:
        # A transformers model names its type in its config; a GGUF model its architecture.
        config = getattr(gen.model, "config", None)
        model_type = getattr(config, "model_type", None) or getattr(gen.model, "architecture", None)
        return {
            "model_path": srv.model_name,
            "tokenizer_path": srv.model_name,
            "is_generation": True,
            "model_type": model_type,
            "architectures": getattr(config, "architectures", None),
        }

    @app.get("/v1/loads")
    async def loads(include: str | None = None) -> dict[str, Any]:
        one = figures()
        return {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "version": "offgraph-kv",
            "dp_rank_count": 1,
            "loads": [one],
            "aggregate": {
                "total_running_reqs": one["num_running_reqs"],
                "total_waiting_reqs": one["num_waiting_reqs"],
                "total_reqs": one["num_total_reqs"],
                "avg_token_usage": one["token_usage"],
            },
        }

    @app.get("/get_load")
    async def get_load() -> dict[str, Any]:
        one = figures()
        return {"load": one["num_total_reqs"], **one}

    for path in ("/server_info", "/get_server_info"):
        app.add_api_route(path, server_info, methods=["GET"])
    for path in ("/model_info", "/get_model_info"):
        app.add_api_route(path, model_info, methods=["GET"])

    @app.get("/health_generate", response_model=None)
    async def health_generate() -> JSONResponse:
        if not worker.alive:
            return JSONResponse({"status": "error", "error": repr(worker.error)}, status_code=503)
        try:
            await asyncio.wait_for(worker.call(lambda: None), HEALTH_GENERATE_TIMEOUT)
        except (asyncio.TimeoutError, RuntimeError) as e:
            return JSONResponse({"status": "error", "error": repr(e)}, status_code=503)
        return JSONResponse({"status": "ok"})
