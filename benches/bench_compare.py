"""Byte-layer and attention comparisons: the same as ``offgraph-kv bench``
(see ``offgraph_kv.tools.bench``), kept here beside the criterion benches."""

import sys

from offgraph_kv.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
