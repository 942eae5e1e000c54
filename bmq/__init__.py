"""bmq: a fast, dependable synchronous Python client for BlazingMQ."""
import logging

from . import exceptions
from .exceptions import *  # noqa: F401,F403

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"
__all__ = ["exceptions", "__version__", *exceptions.__all__]
