"""Build script: compiles the Cython wire codec (bmq._codec) with the local C compiler.

Metadata lives in pyproject.toml. Set BMQ_ANNOTATE=1 to write Cython's HTML annotation
next to the sources (to see where the hot path touches Python objects).
"""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "bmq._codec",
        sources=["bmq/_codec.pyx"],
        include_dirs=["bmq/_wire"],
        depends=[os.path.join("bmq/_wire", name) for name in os.listdir("bmq/_wire")],
        extra_compile_args=["-O3", "-fno-strict-aliasing"],
    )
]

setup(
    ext_modules=cythonize(
        extensions,
        include_path=["bmq/_wire"],
        annotate=os.environ.get("BMQ_ANNOTATE") == "1",
        compiler_directives={
            "language_level": 3,
            "embedsignature": True,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )
)
