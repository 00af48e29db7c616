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


# ---- one install story -------------------------------------------------------------------------
# "pip install fastaccum" or "pip install 'fastaccum[ray]'": a PyPI project name, which does not
# exist until a release (a checkout's '.[ray]' or a wheel file's path is something else).
PYPI_INSTALL = re.compile(r"pip install\s+['\"]?fastaccum(\[[\w,-]*\])?['\"]?(?![\w.-])")
RELEASE_SECTION = re.compile(r"^## Once a release exists\n.*?(?=^## |\Z)", re.S | re.M)


def _install_story_texts() -> list[tuple[Path, str]]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    code = [*sorted((ROOT / "fastaccum").rglob("*.py")), *sorted((ROOT / "examples").glob("*.py"))]
    return [(path, path.read_text(encoding="utf-8")) for path in pages + code]


def test_no_page_or_message_tells_users_to_install_an_unreleased_pypi_project() -> None:
    """Only docs/install.md's "Once a release exists" gives the PyPI commands as commands; any
    other mention says they find nothing."""
    wrong = []
    for path, text in _install_story_texts():
        if path.name == "install.md":
            assert RELEASE_SECTION.search(text), "docs/install.md has no '## Once a release exists' section"
            text = RELEASE_SECTION.sub("", text)
        for found in PYPI_INSTALL.finditer(text):
            if "finds nothing" not in text[found.end() : found.end() + 40]:
                line = text.count("\n", 0, found.start()) + 1
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {found.group(0)}")
    assert not wrong, "these pages install fastaccum from PyPI, where no release is: " + "; ".join(wrong)


def test_the_install_page_says_what_is_built_for_aarch64() -> None:
    text = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    assert "## What is built for which machine" in text and "aarch64" in text
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/install.md" in readme and "no aarch64 wheel has been built" in readme
