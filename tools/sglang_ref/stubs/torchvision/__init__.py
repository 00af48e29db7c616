"""Import stub for torchvision: SGLang's multimodal helpers import it at module level.

PyPI's torchvision does not load next to the local CPU torch wheel (its C++ ops fail to register),
and nothing on SGLang's output path uses it. Every ``torchvision.*`` submodule imports as an empty
module whose attributes are inert placeholders; calling one raises.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+stub"


class _Placeholder:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Placeholder:
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: object, **kwargs: object) -> object:
        raise RuntimeError(f"{self._name} is a stub (fastaccum's SGLang reference venv has no torchvision)")

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        return (object,)


def _module_getattr(module_name: str):  # noqa: ANN202
    def __getattr__(attr: str) -> object:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{module_name}.{attr}")

    return __getattr__


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):  # noqa: ANN001, ANN201
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)  # type: ignore[method-assign]
        return module

    def exec_module(self, module):  # noqa: ANN001, ANN201
        return None


sys.meta_path.insert(0, _StubFinder())
__getattr__ = _module_getattr(__name__)
