"""``python -m bmq``: the same as the ``bmq`` console script."""
import sys

from .cli import main

sys.exit(main())
