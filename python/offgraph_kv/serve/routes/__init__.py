"""The HTTP routes, one module per family, each registered the same way: a module's
``register(app, srv)`` adds its routes to the app, over the app's :class:`~..server.Server`, and
:func:`~..app.create_app` calls it for every one of :data:`FAMILIES`.

* :mod:`.completions`: ``/v1/completions``, ``/v1/chat/completions`` (whole or streamed);
* :mod:`.tokenize`: ``/tokenize``, ``/detokenize``;
* :mod:`.models`: ``/v1/models``;
* :mod:`.health`: ``/health``, ``/metrics``;
* :mod:`.replica`: what a router in front of replicas asks (``/v1/loads``, ``/server_info``,
  ``/model_info``, ``/health_generate``).
"""

from __future__ import annotations

from . import completions, health, models, replica, tokenize

__all__ = ["FAMILIES"]

FAMILIES = (completions, tokenize, models, health, replica)
