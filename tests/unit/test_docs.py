"""Every public name of bmq carries a docstring (public classes: their public methods too)."""
from __future__ import annotations

import inspect

import pytest

import bmq
import bmq.broker
import bmq.events
import bmq.exceptions

MODULES = [bmq, bmq.broker, bmq.events, bmq.exceptions]


def public_objects():
    for module in MODULES:
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj


@pytest.mark.parametrize("qualname, obj", list(public_objects()), ids=lambda v: v if isinstance(v, str) else "")
def test_public_object_is_documented(qualname, obj):
    assert inspect.getdoc(obj), f"{qualname} has no docstring"
    if not inspect.isclass(obj) or issubclass(obj, BaseException):
        return
    undocumented = [
        name for name, member in vars(obj).items()
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
        and not inspect.getdoc(member)
    ]
    assert not undocumented, f"{qualname}: undocumented public members {undocumented}"


def test_modules_are_documented():
    for module in MODULES:
        assert inspect.getdoc(module), module.__name__
