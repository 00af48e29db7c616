"""The package version: pyproject.toml reads it at build time, ``fastaccum.__version__`` at run time."""

__version__ = "0.2.0"
