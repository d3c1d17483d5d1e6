"""``python -m offgraph_kv``: the same as the ``offgraph-kv`` command."""

import sys

from .tools.cli import main

sys.exit(main())
