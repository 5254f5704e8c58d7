"""Link: numbers or strings with units, and errors that name the argument and the units."""

import pickle

import pytest

from exogym.core.comm.links import Link, parse_bandwidth, parse_latency


def test_numbers_are_bits_per_second_and_seconds() -> None:
    link = Link(1e9, 0.08)
    assert (link.bandwidth, link.latency) == (1e9, 0.08)
    assert Link(5, 0).latency == 0.0


@pytest.mark.parametrize(
    ("text", "bits"),
    [
        ("1Gbit/s", 1e9),
        ("100Mbit/s", 100e6),
        ("100 Mbps", 100e6),
        ("2.5kbit/s", 2500.0),
        ("10bit/s", 10.0),
        ("1Tbit/s", 1e12),
        ("1GB/s", 8e9),  # bytes: x 8
        ("1e3Mbit/s", 1e9),
    ],
)
def test_bandwidth_strings_convert_to_bits_per_second(text: str, bits: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(bits, rel=1e-12)


@pytest.mark.parametrize(
    ("text", "seconds"), [("80ms", 0.08), ("10us", 1e-5), ("10µs", 1e-5), ("2s", 2.0), ("500ns", 5e-7), ("0ms", 0.0)]
)
def test_latency_strings_convert_to_seconds(text: str, seconds: float) -> None:
    assert parse_latency(text) == pytest.approx(seconds, rel=1e-12)


def test_link_accepts_strings() -> None:
    assert Link("1Gbit/s", "80ms") == Link(1e9, 0.08)


@pytest.mark.parametrize("bad", ["1Gbit", "fast", "1 parsec/s", "", "-1Gbit/s"])
def test_bad_bandwidth_units_name_the_argument_and_the_accepted_units(bad: str) -> None:
    with pytest.raises(ValueError, match=r"Link bandwidth.*(Gbit/s|> 0)"):
        Link(bad, 0)


@pytest.mark.parametrize("bad", ["80 m", "80 min", "ms", "-1ms"])
def test_bad_latency_units_name_the_argument_and_the_accepted_units(bad: str) -> None:
    with pytest.raises(ValueError, match=r"Link latency.*(ms|>= 0)"):
        Link(1e9, bad)


def test_out_of_range_numbers_and_wrong_types_are_refused() -> None:
    with pytest.raises(ValueError, match=r"bandwidth must be in \[1, 1e\+15\] bits/s"):
        Link(0, 0)
    with pytest.raises(ValueError, match=r"latency must be in \[0, 10000\] s"):
        Link(1e9, -1e-3)
    with pytest.raises(TypeError, match="Link bandwidth must be bits/s"):
        Link(None, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Link latency must be seconds"):
        Link(1e9, True)


def test_links_pickle_and_compare_by_value() -> None:
    link = Link("1Gbit/s", "80ms")
    assert pickle.loads(pickle.dumps(link)) == link and hash(link) == hash(Link(1e9, 0.08))
