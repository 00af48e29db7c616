"""Fixtures shared by the transport tests (the ``impl`` fixture is in the root conftest.py)."""

from __future__ import annotations

from types import ModuleType

import pytest
from client_helpers import Transport

import fastaccum.transport.aiohttp_stream
import fastaccum.transport.body
import fastaccum.transport.client
import fastaccum.transport.consumer
import fastaccum.transport.request

# Each transport module names the twin its streams feed (StreamConsumer._new_accumulator).
TRANSPORT_MODULES = (
    fastaccum.transport.consumer,
    fastaccum.transport.aiohttp_stream,
    fastaccum.transport.request,
    fastaccum.transport.body,
)


@pytest.fixture
def twin(impl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Run every transport on the twin under test."""
    for module in TRANSPORT_MODULES:
        monkeypatch.setattr(module, "StreamAccumulator", impl.StreamAccumulator)
    return impl


@pytest.fixture(params=["aiohttp", "client"])
def transport(request: pytest.FixtureRequest, twin: ModuleType) -> Transport:
    """Each transport (GenerateStream on aiohttp, fastaccum.Client) on the twin under test."""
    return Transport(request.param)
