"""``python -m bmq.broker``: the embedded broker in the foreground."""
import sys

from .cli import main

sys.exit(main())
