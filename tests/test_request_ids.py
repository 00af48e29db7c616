"""Request ids: every call of an adapter gets an id of its own, never a prefix of another.

SGLang's HTTP entry takes an abort by exact rid, but its scheduler then aborts every request whose
rid *starts with* it: if sample 1's id were a prefix of sample 10's, aborting one would abort both.
vLLM aborts by exact id, so its ids need only be unique. A resumed sample calls again with the
same index, so the random part is what keeps its ids apart."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fastaccum.slime import _generate as slime_generate
from fastaccum.transport.client import Client
from fastaccum.vime import _generate as vime_generate


def _clashes(rids: list[str]) -> list[tuple[str, str]]:
    ordered = sorted(rids)  # a prefix sorts right before the rids it starts
    return [(a, b) for a, b in zip(ordered, ordered[1:]) if b.startswith(a)]


@pytest.mark.parametrize("new_rid", [slime_generate.new_rid, vime_generate.new_rid], ids=["slime", "vime"])
def test_adapter_ids_are_unique_per_call_and_never_a_prefix_of_one_another(new_rid: object) -> None:
    samples = [SimpleNamespace(index=i) for i in range(1001)]
    rids = [new_rid(sample) for sample in samples for _ in range(3)]  # a sample resumed twice
    assert len(set(rids)) == len(rids)
    assert not _clashes(rids)
    assert all(rid.startswith(f"fastaccum-{i // 3}-") for i, rid in enumerate(rids))  # names its sample


def test_a_clients_own_ids_are_unique_and_never_a_prefix_of_one_another() -> None:
    clients = [Client("http://127.0.0.1:1") for _ in range(3)]
    rids = [client._new_rid() for client in clients for _ in range(1001)]
    assert len(set(rids)) == len(rids) and not _clashes(rids)
