"""Type aliases of message properties (the official package's ``PropertyValueDict`` and
``PropertyTypeDict``)."""
from __future__ import annotations

from typing import Mapping, Union

from bmq import PropertyType

__all__ = ["PropertyValueType", "PropertyValueDict", "PropertyTypeDict"]

PropertyValueType = Union[int, bytes, str]
PropertyValueDict = Mapping[str, PropertyValueType]
PropertyTypeDict = Mapping[str, PropertyType]
