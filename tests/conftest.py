"""Fixtures shared by the transport tests (the ``impl`` fixture is in the root conftest.py)."""

from __future__ import annotations

from types import ModuleType

import pytest

import fastaccum.client as client_module


@pytest.fixture
def twin(impl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Run the client on the twin under test (the client builds ``client.StreamAccumulator``)."""
    monkeypatch.setattr(client_module, "StreamAccumulator", impl.StreamAccumulator)
    return impl
