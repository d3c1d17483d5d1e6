"""``offgraph-kv serve``: an OpenAI-compatible HTTP server over a
:class:`~offgraph_kv.hf.BatchGenerator` (needs the ``[serve]`` extra: FastAPI, uvicorn,
prometheus-client).

* :mod:`.protocol`: OpenAI's request models, error bodies, responses and stream chunks;
* :mod:`.worker`: the thread that steps the generator, admission control, cancellation;
* :mod:`.app`: the FastAPI app (:func:`~.app.create_app`: middleware, error handler, routes);
* :mod:`.routes`: the endpoints, one module per family (completions, tokenize, models, health);
* :mod:`.server`: the app's state, a request's jobs; :mod:`.choice`: a choice's text as it
  streams (stop strings, logprobs);
* :mod:`.metrics`: the Prometheus metrics;
* :mod:`.loading`: what MODEL names, which engine runs it (native for a ``.gguf`` and the known
  names, torch for a transformers directory), and its tokenizer's chat format;
* :mod:`.tokens`: the tokenizer face the app uses, the same for both engines;
* :mod:`.auth`: the ``--api-key`` check;
* :mod:`.run`: the server process (:func:`~.run.serve` of :class:`~.run.ServeOptions`; the
  command line that fills them is :mod:`offgraph_kv.tools.cli`'s).
"""
