"""Build script: maps the top-level folders to import names and compiles the Cython core.

PEP 621 metadata lives in pyproject.toml; this file only holds what setuptools cannot
express there declaratively (the folder mapping and the extension modules).
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

NATIVE_MODULES = ["kv_blocks", "batch_builder", "board", "radix"]

extensions = [
    Extension(
        f"tinyserve_native.{name}",
        [f"tinyserve_native/{name}.pyx"],
        extra_compile_args=["-O2"],
    )
    for name in NATIVE_MODULES
]

setup(
    packages=[
        "tinyserve",
        "tinyserve.cli",
        "tinyserve.engine",
        "tinyserve.engine.embeddings",
        "tinyserve.engine.kv",
        "tinyserve.engine.model",
        "tinyserve.engine.output",
        "tinyserve.engine.request",
        "tinyserve.engine.runtime",
        "tinyserve.engine.scheduling",
        "tinyserve.engine.speculation",
        "tinyserve.frontend",
        "tinyserve.frontend.anthropic",
        "tinyserve.frontend.chat",
        "tinyserve.frontend.dashboard",
        "tinyserve.frontend.dashboard.static",  # data only: listed so setuptools ships it
        "tinyserve.frontend.embeddings",
        "tinyserve.frontend.http",
        "tinyserve.frontend.link",
        "tinyserve.frontend.models",
        "tinyserve.frontend.native",
        "tinyserve.frontend.openai",
        "tinyserve.frontend.prompt",
        "tinyserve.frontend.request",
        "tinyserve.frontend.responses",
        "tinyserve.frontend.structured",
        "tinyserve.frontend.tokenize",
        "tinyserve_native",
    ],
    package_dir={
        "tinyserve": "tinyserve",
        "tinyserve.engine": "engine",
        "tinyserve.frontend": "frontend",
        "tinyserve_native": "tinyserve_native",
    },
    package_data={
        "tinyserve_native": ["*.pxd", "*.pyi", "*.h", "py.typed"],
        # the dashboard's page: served from the installed package, never from a CDN
        "tinyserve.frontend.dashboard.static": ["*.html", "*.js", "*.css"],
    },
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False},
    ),
    zip_safe=False,
)
