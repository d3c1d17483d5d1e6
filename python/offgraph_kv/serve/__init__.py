"""``offgraph-kv serve``: an OpenAI-compatible HTTP server over a
:class:`~offgraph_kv.hf.BatchGenerator` (needs the ``[serve]`` extra: FastAPI, uvicorn,
prometheus-client).

* :mod:`.protocol`: OpenAI's request models, error bodies, responses and stream chunks;
* :mod:`.engine`: the thread that steps the generator, admission control, cancellation;
* :mod:`.app`: the FastAPI app (endpoints, streaming, stop strings);
* :mod:`.metrics`: the Prometheus metrics;
* :mod:`.loading`: what MODEL names, and its tokenizer's chat format;
* :mod:`.run`: the server process (:func:`~.run.serve` of :class:`~.run.ServeOptions`; the
  command line that fills them is :mod:`offgraph_kv.tools.cli`'s).
"""
