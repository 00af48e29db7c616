"""The docs describe the tree as it is: docs/core.md's module map names every module, and only
modules that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAP_SECTION = re.compile(r"^## Module map\n(.*?)^## ", re.S | re.M)
# A path in backticks, or a sibling written after it as `other.h` or `+ .pxd`.
CELL = re.compile(r"`([\w./]+)`|\+ `?(\.\w+)`?")


def _module_map() -> str:
    text = (ROOT / "docs" / "core.md").read_text(encoding="utf-8")
    found = MAP_SECTION.search(text)
    assert found, "docs/core.md has no '## Module map' section"
    return found.group(1)


def _named_files() -> set[str]:
    """The files the map's table names, with its shorthands expanded: `python/x.py`,
    `src_cython/x.pyx` + `.pxd`, `src_cython/fa_scan.h`, `fa_bytes.h` (same folder)."""
    named: set[str] = set()
    for line in _module_map().splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        folder = ""
        last = ""
        for match in CELL.finditer(first_cell):
            path, suffix = match.groups()
            if suffix:  # "+ .pxd": the previous file with another suffix
                named.add(last.rsplit(".", 1)[0] + suffix)
                continue
            if "/" in path:
                folder = path.rsplit("/", 1)[0] + "/"
            else:
                path = folder + path
            named.add(path)
            last = path
    return named


def _tree() -> set[str]:
    files = {f"fastaccum/{p.name}" for p in (ROOT / "fastaccum").glob("*.py")}
    # subpackages (fastaccum/_py and fastaccum/_cy link the twins' folders, listed below)
    for package in (ROOT / "fastaccum").iterdir():
        if package.is_dir() and not package.is_symlink() and (package / "__init__.py").exists():
            files |= {f"fastaccum/{package.name}/{p.name}" for p in package.glob("*.py")}
    files |= {f"python/{p.name}" for p in (ROOT / "python").glob("*.py")}
    for pattern in ("*.py", "*.pyi", "*.pyx", "*.pxd", "*.h"):
        files |= {f"src_cython/{p.name}" for p in (ROOT / "src_cython").glob(pattern)}
    return files


def test_the_module_map_names_every_module() -> None:
    missing = sorted(_tree() - _named_files())
    assert not missing, f"docs/core.md's module map does not name {missing}"


def test_every_file_the_module_map_names_exists() -> None:
    stale = sorted(path for path in _named_files() if not (ROOT / path).exists())
    assert not stale, f"docs/core.md's module map names files that do not exist: {stale}"


@pytest.mark.parametrize("folder", ["fastaccum", "python", "src_cython"])
def test_no_module_is_over_600_lines(folder: str) -> None:
    # Small modules: one job each, readable in one sitting.
    long = {
        str(path.relative_to(ROOT)): lines
        for path in (ROOT / folder).rglob("*.py*")
        if path.suffix in (".py", ".pyx") and (lines := len(path.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert not long, long


def test_every_package_is_shipped() -> None:
    """setup.py lists the packages a wheel holds: each folder of fastaccum/ with an __init__.py."""
    listed = set(re.findall(r'"(fastaccum(?:\.\w+)?)"', (ROOT / "setup.py").read_text()))
    packages = {"fastaccum"} | {f"fastaccum.{path.parent.name}" for path in (ROOT / "fastaccum").glob("*/__init__.py")}
    assert packages <= listed, f"setup.py does not ship {sorted(packages - listed)}"
