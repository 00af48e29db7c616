"""Build fastaccum: the compiled twin (fastaccum._cy) when possible, the pure twin always."""

import glob
import os
import sys
import sysconfig
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NO_EXTENSIONS = os.environ.get("FASTACCUM_NO_EXTENSIONS", "") not in ("", "0")
# cibuildwheel and CI must never ship or test a wheel that silently lacks the extension.
REQUIRE_EXTENSIONS = os.environ.get("FASTACCUM_REQUIRE_EXTENSIONS") == "1" or os.environ.get("CIBUILDWHEEL") == "1"
DEBUG = os.environ.get("FASTACCUM_CYTHON_DEBUG") == "1"
if sys.implementation.name != "cpython":
    NO_EXTENSIONS = True
if NO_EXTENSIONS and REQUIRE_EXTENSIONS:
    raise SystemExit("FASTACCUM_REQUIRE_EXTENSIONS=1 contradicts FASTACCUM_NO_EXTENSIONS=1")


# What the C headers in src_cython/ chose for this compiler and platform, each macro expanded
# by the preprocessor exactly as it will be in the build (see each header for the guard).
PROBE = """#include <Python.h>
#include "fa_base64.h"
#include "fa_bytes.h"
#include "fa_mman.h"
#include "fa_scan.h"
#if defined(__GNUC__) || defined(__clang__)
#define FA_GNU_FLAGS 1
#else
#define FA_GNU_FLAGS 0
#endif
fastaccum_probe FA_GNU_FLAGS FA_B64_AVX2 FA_CLINGER FA_SWAR FA_HAVE_MEMRCHR FA_MREMAP
"""
FEATURES = ("AVX2 base64 kernel", "Clinger fast path", "SWAR digits", "memrchr", "mremap")


class OptionalBuildExt(build_ext):
    """Falls back to the pure twin when the compiler fails, unless the extension is required.

    Says in one line what it compiled: the build kind and the optional parts the headers chose."""

    def probe(self, ext: Extension) -> list[str] | None:
        """The probe's expanded macros ("1"/"0"), or None when the preprocessor cannot run."""
        with tempfile.TemporaryDirectory() as tmp:
            source, output = os.path.join(tmp, "probe.c"), os.path.join(tmp, "probe.i")
            with open(source, "w") as f:
                f.write(PROBE)
            try:
                self.compiler.preprocess(
                    source, output, include_dirs=[*ext.include_dirs, sysconfig.get_paths()["include"]]
                )
                with open(output) as f:
                    lines = [line.split()[1:] for line in f if line.startswith("fastaccum_probe")]
            except Exception:
                return None
        return [v.strip("()") for v in lines[0]] if lines else None

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # distutils raises several unrelated classes here
            if REQUIRE_EXTENSIONS:
                raise
            print(f"fastaccum: compiled core not built ({exc}); the pure-Python twin will be used")

    announced = False

    def build_extension(self, ext: Extension) -> None:
        found = self.probe(ext)
        gnu = found is not None and found[0] == "1"
        # -Wall -Wextra keep the headers honest; other compilers get no flags they may not know.
        if gnu:
            ext.extra_compile_args = ["-O0", "-g"] if DEBUG else ["-O3"]
            ext.extra_compile_args += ["-Wall", "-Wextra"]
        parts = (
            ", ".join(f"{name}: {'yes' if value == '1' else 'no'}" for name, value in zip(FEATURES, found[1:]))
            if found
            else "optional parts unknown"
        )
        if not OptionalBuildExt.announced:  # one line for the whole core, not one per module
            OptionalBuildExt.announced = True
            print(f"fastaccum: compiled core ({'debug' if DEBUG else 'release'}; {parts})")
        try:
            super().build_extension(ext)
        except Exception as exc:
            if REQUIRE_EXTENSIONS:
                raise
            print(f"fastaccum: {ext.name} not built ({exc}); the pure-Python twin will be used")


# The compiled twin, module by module: hand-written Cython for what needs C's own representation,
# and the pure twin's own files compiled with an augmenting .pxd (src_cython/<name>.pxd) where the
# same source compiles to the same speed. Each builds as fastaccum._cy.<name>; the pure twin keeps
# importing its interpreted copy as fastaccum._py.<name>.
HAND_WRITTEN = ("buffers", "framing", "fields", "stream", "scan", "scan_chunk", "accumulator")
SINGLE_SOURCE = ("chunked", "lengths")


def _link_packages(root: str) -> None:
    """Show the two source folders in ``root`` under the names they are built as, so ``cimport
    fastaccum._cy.framing`` finds src_cython/framing.pxd in a checkout and an sdist alike (the
    checkout's own fastaccum/_cy and fastaccum/_py links are not in the sdist)."""
    package = os.path.join(root, "fastaccum")
    os.makedirs(package)
    for name, folder in (("_cy", "src_cython"), ("_py", "python")):
        os.symlink(os.path.abspath(folder), os.path.join(package, name))


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
    # The parts and the C headers: a change to any of them rebuilds every module.
    depends = sorted(glob.glob("src_cython/*.pxd") + glob.glob("src_cython/*.h"))

    def extension(name: str, source: str) -> Extension:
        return Extension(
            f"fastaccum._cy.{name}",
            [source],
            include_dirs=["src_cython"],
            depends=depends,
            optional=not REQUIRE_EXTENSIONS,
        )

    print(f"fastaccum: building the compiled core ({'required' if REQUIRE_EXTENSIONS else 'optional'})")
    with tempfile.TemporaryDirectory() as links:
        _link_packages(links)
        include_path = [links, "src_cython"]
        hand_written = cythonize(
            [extension(name, f"src_cython/{name}.pyx") for name in HAND_WRITTEN],
            compiler_directives=directives,
            include_path=include_path,
            quiet=True,
        )
        # The shared sources carry annotations for the pure twin and mypy; the .pxd alone gives
        # the compiled types, so Cython must not read the annotations as C types.
        single_source = cythonize(
            [extension(name, f"python/{name}.py") for name in SINGLE_SOURCE],
            compiler_directives={**directives, "annotation_typing": False},
            include_path=include_path,
            quiet=True,
        )
    for ext in hand_written + single_source:
        # Cython finds headers through the links to the source folders; name them by their real
        # path, or the sdist would carry copies under fastaccum/_cy/.
        ext.depends = sorted({os.path.relpath(os.path.realpath(path)) for path in ext.depends})
    return hand_written + single_source


setup(
    # The twins live in python/ and src_cython/ (the checkout links them as fastaccum/_py and
    # fastaccum/_cy for editors and type checkers); only their Python files and the stub ship.
    packages=[
        "fastaccum",
        "fastaccum._core",
        "fastaccum._rollout",
        "fastaccum.areal",
        "fastaccum.cli",
        "fastaccum.emulator",
        "fastaccum.miles",
        "fastaccum.slime",
        "fastaccum.transport",
        "fastaccum.vime",
        "fastaccum._py",
        "fastaccum._cy",
    ],
    package_dir={"fastaccum": "fastaccum", "fastaccum._py": "python", "fastaccum._cy": "src_cython"},
    package_data={"fastaccum": ["py.typed"], "fastaccum._cy": ["__init__.pyi"]},
    include_package_data=False,
    ext_modules=extensions(),
    cmdclass={"build_ext": OptionalBuildExt},
    zip_safe=False,
)
