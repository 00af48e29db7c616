"""Build fastaccum: the compiled twin (fastaccum._cy) when possible, the pure twin always."""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NO_EXTENSIONS = os.environ.get("FASTACCUM_NO_EXTENSIONS", "") not in ("", "0")
# cibuildwheel and CI must never ship or test a wheel that silently lacks the extension.
REQUIRE_EXTENSIONS = (
    os.environ.get("FASTACCUM_REQUIRE_EXTENSIONS") == "1" or os.environ.get("CIBUILDWHEEL") == "1"
)
DEBUG = os.environ.get("FASTACCUM_CYTHON_DEBUG") == "1"
if sys.implementation.name != "cpython":
    NO_EXTENSIONS = True
if NO_EXTENSIONS and REQUIRE_EXTENSIONS:
    raise SystemExit("FASTACCUM_REQUIRE_EXTENSIONS=1 contradicts FASTACCUM_NO_EXTENSIONS=1")


class OptionalBuildExt(build_ext):
    """Falls back to the pure twin when the compiler fails, unless the extension is required."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # distutils raises several unrelated classes here
            if REQUIRE_EXTENSIONS:
                raise
            print(f"fastaccum: compiled core not built ({exc}); the pure-Python twin will be used")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            if REQUIRE_EXTENSIONS:
                raise
            print(f"fastaccum: {ext.name} not built ({exc}); the pure-Python twin will be used")


def extensions() -> list[Extension]:
    if NO_EXTENSIONS:
        print("fastaccum: building the pure-Python twin only (FASTACCUM_NO_EXTENSIONS)")
        return []
    from Cython.Build import cythonize

    directives = {
        "language_level": 3,
        "boundscheck": DEBUG,
        "wraparound": DEBUG,
        "cdivision": not DEBUG,
        "embedsignature": True,
        "initializedcheck": DEBUG,
    }
    cflags = ["-O0", "-g"] if DEBUG else ["-O3"]
    ext = Extension(
        "fastaccum._cy",
        ["src_cython/_cy.pyx"],
        extra_compile_args=cflags,
        optional=not REQUIRE_EXTENSIONS,
    )
    print(f"fastaccum: building the compiled core ({'debug' if DEBUG else 'release'}, "
          f"{'required' if REQUIRE_EXTENSIONS else 'optional'})")
    return cythonize([ext], compiler_directives=directives, quiet=True)


setup(
    packages=["fastaccum", "fastaccum._py"],
    package_dir={"fastaccum": "fastaccum", "fastaccum._py": "python"},
    package_data={"fastaccum": ["py.typed", "_cy.pyi"]},
    ext_modules=extensions(),
    cmdclass={"build_ext": OptionalBuildExt},
    zip_safe=False,
)
