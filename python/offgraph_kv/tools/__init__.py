"""Tools built on the library: the ``offgraph-kv`` command line, demos and comparison benches.

Nothing in the library modules (``batch``, ``store``, ``hf``, ``registry``) imports from here.
"""
