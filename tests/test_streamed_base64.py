"""The compiled twin's streamed routed-experts decode gives exactly the pure twin's results.

Large events are scanned while they arrive and the routed_experts value is decoded piece by piece
(never held whole); every unusual shape must fall back to the ordinary path. The hook
``_debug(stream_after_bytes=...)`` lowers the size at which streaming starts so small streams exercise
it, and every streamed test runs with fastaccum's own AVX2 decoder and with pybase64 alone.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from fastaccum.emulator.writer import WireOptions, split_pieces, stream_bytes, stream_events, synthetic_generation

pytestmark = pytest.mark.c_extension


@pytest.fixture(params=[True, False], ids=["own-decoder", "pybase64"])
def decoder(request: pytest.FixtureRequest) -> bool:
    import fastaccum._cy as cy

    if request.param and not cy.B64_SIMD:
        pytest.skip("fastaccum's own decoder needs AVX2")
    return bool(request.param)


@pytest.fixture(params=[0, 1, 40, 300, 5000], ids=lambda n: f"after{n}")
def streaming(request: pytest.FixtureRequest, decoder: bool) -> dict[str, object]:
    """The compiled twin's switches for a test: the streaming threshold and the decoder."""
    return {"stream_after_bytes": request.param, "decode_in_place": decoder}


def _assert_twins_agree(outcomes, streaming: dict[str, object], data: bytes, sizes: list[int], **kwargs) -> None:
    import fastaccum._cy as cy
    import fastaccum._py as py

    pieces = split_pieces(data, sizes)
    outcomes.assert_same(outcomes.run(cy, pieces, debug=streaming, **kwargs), outcomes.run(py, pieces, **kwargs))


def _stream(rng: random.Random, n: int, incremental: bool, top_p: bool) -> bytes:
    gen = synthetic_generation(
        f"s{rng.random()}", n, prompt_tokens=rng.choice([1, 3, 7]), top_p=top_p, expert_shape=(3, 2)
    )
    opts = WireOptions(incremental=incremental, logprob_text=rng.random() < 0.5)
    return stream_bytes(stream_events(gen, opts, interval=rng.choice([1, 4, 64])))


MUTATIONS = [
    lambda v, rng: v,  # intact
    lambda v, rng: v[:-4] + b"AA==",  # padding
    lambda v, rng: v[:-4] + b"AAA=",
    lambda v, rng: v[:-4] + b"AB==",  # non-zero bits under the padding
    lambda v, rng: v[:8] + b"AA==" + v[8:],  # padding in the middle
    lambda v, rng: v[:-1],  # length not a multiple of 4
    lambda v, rng: v[:5] + b"\\/" + v[5:],  # an escape: orjson's business
    lambda v, rng: v[:6] + b"*" + v[7:],  # a bad character
    lambda v, rng: v[:3] + b"=" + v[4:],
    lambda v, rng: v + b"====",
    lambda v, rng: b"",
    lambda v, rng: v[: rng.randrange(len(v) + 1)],  # the value cut short (JSON breaks)
    lambda v, rng: v[:-4],  # fewer values than expert_shape wants
    # a line end inside the value, anywhere (the scan reads ahead of the framer's line search)
    lambda v, rng: _insert(v, rng, b"\n"),
    lambda v, rng: _insert(v, rng, b"\r"),
    lambda v, rng: _insert(v, rng, b"\r\n"),
    lambda v, rng: _insert(v, rng, b"\n\ndata: "),
    lambda v, rng: _insert(v, rng, b"=\n"),
]


def _insert(value: bytes, rng: random.Random, what: bytes) -> bytes:
    at = rng.randrange(len(value) + 1)
    return value[:at] + what + value[at:]


@pytest.mark.parametrize("mutation", range(len(MUTATIONS)))
def test_streamed_value_matches_the_pure_twin(streaming: dict[str, object], outcomes, mutation: int) -> None:
    rng = random.Random(mutation * 1000 + int(streaming["stream_after_bytes"]))
    for _ in range(6):
        data = _stream(rng, rng.choice([1, 5, 30]), rng.random() < 0.5, rng.random() < 0.5)
        key = b'"routed_experts":"'
        start = data.index(key) + len(key)
        end = data.index(b'"', start)
        value = MUTATIONS[mutation](data[start:end], rng)
        if mutation == 11:
            mutated = data[:start] + value  # the line (and the stream) ends inside the value
        else:
            mutated = data[:start] + value + data[end:]
        sizes = [rng.choice([1, 2, 3, 5, 64, 1000, 65536]) for _ in range(4)]
        for shape in (None, (3, 2)):
            _assert_twins_agree(outcomes, streaming, mutated, sizes, expert_shape=shape)


@pytest.mark.parametrize("unusual", [b"AA==", b"AAA=", b"A===", b"\\/", b"*", b"=", b"\n", b"\r", b'"'], ids=repr)
def test_a_piece_boundary_anywhere_near_an_unusual_character(
    streaming: dict[str, object], outcomes, unusual: bytes
) -> None:
    # A piece is decoded before the quote search once the characters that close the quantum the
    # previous piece left open are taken; cutting at every offset near the unusual characters puts
    # them in each place of that quantum and of the piece that follows.
    import fastaccum._cy as cy
    import fastaccum._py as py

    data = _stream(random.Random(11), 30, True, False)
    key = b'"routed_experts":"'
    at = data.index(key) + len(key) + 16
    mutated = data[:at] + unusual + data[at:]
    close = mutated.index(b'"', at + len(unusual))  # the original closing quote
    for cut in range(at - 6, at + len(unusual) + 6):
        # the next piece 64 bytes long, or running up to the closing quote (the last piece opens with it)
        for second in (cut + 64, max(cut, close)):
            pieces = [mutated[:cut], mutated[cut:second], mutated[second:]]
            for shape in (None, (3, 2)):
                outcomes.assert_same(
                    outcomes.run(cy, pieces, debug=streaming, expert_shape=shape),
                    outcomes.run(py, pieces, expert_shape=shape),
                )


@pytest.mark.parametrize(
    "edit",
    [
        # the key outside meta_info, before it: the placeholder check must reparse the original
        lambda d: d.replace(b'{"text":', b'{"routed_experts":"AAAA","text":', 1),
        # the key twice in meta_info: orjson keeps the last value
        lambda d: d.replace(b'"dp_rank":null', b'"dp_rank":null,"routed_experts":"AQAAAA=="', 1),
        # the value's line ends (blank line) before the closing quote
        lambda d: d.replace(b'"dp_rank"', b'\n\n"dp_rank"', 1),
        # a comment line in the middle of the event, and a second data line
        lambda d: d.replace(b'"dp_rank"', b'\n: ping\ndata: "dp_rank"', 1),
    ],
)
def test_unusual_event_shapes_fall_back(streaming: dict[str, object], outcomes, edit) -> None:
    rng = random.Random(7)
    for trial in range(4):
        data = _stream(rng, 12, trial % 2 == 0, trial >= 2)
        for sizes in ([1], [7, 3], [65536]):
            _assert_twins_agree(outcomes, streaming, edit(data), sizes, expert_shape=None)


def test_max_event_bytes_counts_streamed_characters(streaming: dict[str, object], outcomes) -> None:
    rng = random.Random(3)
    data = _stream(rng, 30, True, False)
    terminal = max(len(line) for line in data.split(b"\n"))
    for limit in (terminal - 7, terminal - 6, terminal - 5, terminal + 100):
        for sizes in ([1], [13], [65536]):
            _assert_twins_agree(outcomes, streaming, data, sizes, expert_shape=(3, 2), max_event_bytes=limit)


def test_streamed_array_is_writable_and_owned(streaming: dict[str, object]) -> None:
    import fastaccum._cy as cy

    gen = synthetic_generation("own", 20, prompt_tokens=4, expert_shape=(3, 2))
    data = stream_bytes(stream_events(gen, WireOptions(incremental=True), interval=4))
    acc = cy.StreamAccumulator(expert_shape=(3, 2))._debug(**streaming)
    for piece in split_pieces(data, [5]):
        acc.feed(piece)
    result = acc.finish()
    assert result.routed_experts.flags.writeable
    assert np.array_equal(result.routed_experts, gen.routed_experts)
    result.routed_experts[0, 0, 0] = -1  # the caller may write into it


ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


@pytest.mark.parametrize("simd", [True, False], ids=["simd", "plain"])
def test_the_decoder_gives_pybase64s_bytes_for_whole_quanta(simd: bool) -> None:
    import pybase64

    import fastaccum._cy as cy

    rng = random.Random(5)
    # every tail the plain loop can finish (0-40 characters) after 0-11 vector steps, and long runs
    for n in [*range(0, 400, 4), 4096, 65536]:
        text = bytes(rng.choice(ALPHABET) for _ in range(n))
        assert cy._b64_decode(text, simd) == pybase64.b64decode(text, validate=True)


@pytest.mark.parametrize("simd", [True, False], ids=["simd", "plain"])
def test_the_decoder_refuses_any_other_byte_at_any_position(simd: bool) -> None:
    import fastaccum._cy as cy

    others = [bytes([b]) for b in range(256) if b not in ALPHABET]  # '=' included: padding is pybase64's
    rng = random.Random(6)
    for n in (4, 40, 44, 48, 76, 108):
        text = bytes(rng.choice(ALPHABET) for _ in range(n))
        for at in range(n):
            for other in others:
                assert cy._b64_decode(text[:at] + other + text[at + 1 :], simd) is None, (n, at, other)


def test_the_own_decoder_is_on_by_default_exactly_where_the_cpu_has_avx2() -> None:
    import fastaccum._cy as cy

    acc = cy.StreamAccumulator()
    assert acc._own_decoder == cy.B64_SIMD
    assert acc._debug(decode_in_place=False)._own_decoder is False
    assert acc._debug(decode_in_place=True)._own_decoder == cy.B64_SIMD


@pytest.mark.parametrize("mutation", range(len(MUTATIONS)))
def test_both_replay_values_stream_and_match_the_pure_twin(
    streaming: dict[str, object], outcomes, mutation: int
) -> None:
    """An event with routed experts and the indexer top-k: each value streams in turn, and an
    unusual indexer value (after a routed value streamed whole) puts both back as they came."""
    rng = random.Random(mutation * 7919 + int(streaming["stream_after_bytes"]))
    for _ in range(4):
        n = rng.choice([1, 5, 30])
        gen = synthetic_generation(
            f"b{rng.random()}", n, prompt_tokens=rng.choice([1, 3]), expert_shape=(3, 2), indexer_shape=(2, 4)
        )
        data = stream_bytes(stream_events(gen, WireOptions(incremental=rng.random() < 0.5), interval=4))
        key = b'"indexer_topk":"'
        start = data.index(key) + len(key)
        end = data.index(b'"', start)
        value = MUTATIONS[mutation](data[start:end], rng)
        mutated = data[:start] + value + (b"" if mutation == 11 else data[end:])
        sizes = [rng.choice([1, 2, 3, 5, 64, 1000, 65536]) for _ in range(4)]
        for shapes in ({}, {"expert_shape": (3, 2), "indexer_shape": (2, 4)}):
            _assert_twins_agree(outcomes, streaming, mutated, sizes, **shapes)
