"""Unit parsers: GPU requests and fractions, memory, CPU, and MiB rendering."""

from __future__ import annotations

import pytest

from fgpu.model.units import (
    MILLI_PER_GPU,
    UnitError,
    format_mib,
    parse_cpu_milli,
    parse_gpu_fraction,
    parse_gpu_request,
    parse_memory_mib,
)


def test_one_gpu_is_1000_milli() -> None:
    assert MILLI_PER_GPU == 1000


# --------------------------------------------------------------------------- GPU request


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.5", (1, 500)),
        ("0.25", (1, 250)),
        (".3", (1, 300)),
        ("0.001", (1, 1)),
        ("1", (1, 1000)),
        ("1.0", (1, 1000)),
        ("2", (2, 1000)),
        ("8", (8, 1000)),
        (" 4 ", (4, 1000)),
        (0.5, (1, 500)),
        (3, (3, 1000)),
    ],
    ids=[
        "half",
        "quarter",
        "leading-dot",
        "smallest",
        "one",
        "one-point-zero",
        "two",
        "eight",
        "padded",
        "float",
        "int",
    ],
)
def test_parse_gpu_request(text: str | float, expected: tuple[int, int]) -> None:
    assert parse_gpu_request(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not a plain decimal number"),
        ("abc", "not a plain decimal number"),
        ("nan", "not a plain decimal number"),
        ("inf", "not a plain decimal number"),
        ("0", "a GPU request must be positive"),
        ("-1", "a GPU request must be positive"),
        ("1.5", "above 1 a GPU request is a whole number of GPUs"),
        ("0.0004", "a GPU fraction must be at least 0.001"),
    ],
    ids=["empty", "word", "nan", "inf", "zero", "negative", "fraction-above-one", "too-small"],
)
def test_parse_gpu_request_rejects(text: str, reason: str) -> None:
    with pytest.raises(UnitError) as caught:
        parse_gpu_request(text)
    assert caught.value.field == "gpu"
    assert caught.value.reason == reason
    assert str(caught.value) == f"gpu: {reason} (got {text!r})"


def test_parse_gpu_request_names_the_given_field() -> None:
    with pytest.raises(UnitError, match=r"^gpus: a GPU request must be positive \(got '0'\)$"):
        parse_gpu_request("0", field="gpus")


# --------------------------------------------------------------------------- GPU fraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.5", 500),
        ("0.3", 300),
        ("0.001", 1),
        ("0.0015", 2),
        ("0.1234", 123),
        ("1", 1000),
        (0.75, 750),
    ],
    ids=["half", "three-tenths", "smallest", "rounds-half-even-up", "rounds-down", "one", "float"],
)
def test_parse_gpu_fraction(text: str | float, expected: int) -> None:
    assert parse_gpu_fraction(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not a plain decimal number"),
        ("half", "not a plain decimal number"),
        ("nan", "not a plain decimal number"),
        ("-inf", "not a plain decimal number"),
        ("0", "a GPU fraction must be in (0, 1]"),
        ("-0.5", "a GPU fraction must be in (0, 1]"),
        ("1.01", "a GPU fraction must be in (0, 1]"),
        ("2", "a GPU fraction must be in (0, 1]"),
        ("0.0004", "a GPU fraction must be at least 0.001"),
    ],
    ids=["empty", "word", "nan", "minus-inf", "zero", "negative", "above-one", "two", "too-small"],
)
def test_parse_gpu_fraction_rejects(text: str, reason: str) -> None:
    with pytest.raises(UnitError) as caught:
        parse_gpu_fraction(text, field="gpu_fraction")
    assert (caught.value.field, caught.value.value, caught.value.reason) == (
        "gpu_fraction",
        text,
        reason,
    )
    assert str(caught.value).startswith("gpu_fraction: ")


# --------------------------------------------------------------------------- memory


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5GiB", 5120),
        ("5120MiB", 5120),
        ("5G", 5120),
        ("5Gi", 5120),
        ("5gib", 5120),
        ("1.5GiB", 1536),
        ("5120", 5120),
        ("5120M", 5120),
        ("1TiB", 1024 * 1024),
        ("1T", 1024 * 1024),
        (" 5 GiB ", 5120),
        ("0.5MiB", 1),
        ("0.001GiB", 2),
        ("5GB", 5120),
        ("5120MB", 5120),
        ("1TB", 1024 * 1024),
        ("1.5gb", 1536),
        (5120, 5120),
    ],
    ids=[
        "gib",
        "mib",
        "g-means-gib",
        "gi",
        "lower-case",
        "fractional-gib",
        "bare-is-mib",
        "m-means-mib",
        "tib",
        "t-means-tib",
        "spaces",
        "rounds-up-half-mib",
        "rounds-up-fraction",
        "gb-means-gib",
        "mb-means-mib",
        "tb-means-tib",
        "lower-case-gb",
        "int",
    ],
)
def test_parse_memory_mib(text: str | int, expected: int) -> None:
    assert parse_memory_mib(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "expected a number with an optional unit, e.g. 5GiB"),
        ("abc", "expected a number with an optional unit, e.g. 5GiB"),
        ("-1GiB", "memory must be positive"),
        ("nan", "expected a number with an optional unit, e.g. 5GiB"),
        ("inf", "expected a number with an optional unit, e.g. 5GiB"),
        ("5 G B", "expected a number with an optional unit, e.g. 5GiB"),
        ("0", "memory must be positive"),
        ("0GiB", "memory must be positive"),
        (
            "5XB",
            "unknown unit 'XB'; use MiB, GiB or TiB "
            "(M/MB, G/GB and T/TB mean the same: binary; a bare number is MiB)",
        ),
        (0, "memory must be positive"),
        (-5, "memory must be positive"),
        (True, "not a memory size"),
    ],
    ids=[
        "empty",
        "word",
        "negative",
        "nan",
        "inf",
        "split-unit",
        "zero",
        "zero-gib",
        "unknown-unit",
        "int-zero",
        "int-negative",
        "bool",
    ],
)
def test_parse_memory_mib_rejects(text: str | int, reason: str) -> None:
    with pytest.raises(UnitError) as caught:
        parse_memory_mib(text)
    assert (caught.value.field, caught.value.reason) == ("gpu_memory", reason)
    assert str(caught.value) == f"gpu_memory: {reason} (got {text!r})"


def test_parse_memory_mib_names_the_given_field() -> None:
    with pytest.raises(UnitError, match=r"^memory: memory must be positive \(got '0'\)$"):
        parse_memory_mib("0", field="memory")


# --------------------------------------------------------------------------- CPU


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", 2000),
        ("0.5", 500),
        ("250m", 250),
        ("1.25", 1250),
        ("0.001", 1),
        (" 4 ", 4000),
        (1.5, 1500),
        (3, 3000),
    ],
    ids=[
        "two-cores",
        "half-core",
        "milli-suffix",
        "quarter-past",
        "one-milli",
        "padded",
        "float",
        "int",
    ],
)
def test_parse_cpu_milli(text: str | float, expected: int) -> None:
    assert parse_cpu_milli(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not a plain decimal number"),
        ("m", "not a plain decimal number"),
        ("two", "not a plain decimal number"),
        ("nan", "not a plain decimal number"),
        ("0", "CPU must be positive"),
        ("-1", "CPU must be positive"),
        ("-250m", "CPU must be positive"),
        ("0.0005", "CPU must be a whole number of milli-cores"),
        ("2.5m", "CPU must be a whole number of milli-cores"),
    ],
    ids=[
        "empty",
        "bare-m",
        "word",
        "nan",
        "zero",
        "negative",
        "negative-milli",
        "below-one-milli",
        "fractional-milli",
    ],
)
def test_parse_cpu_milli_rejects(text: str, reason: str) -> None:
    with pytest.raises(UnitError) as caught:
        parse_cpu_milli(text)
    assert (caught.value.field, caught.value.reason) == ("cpu", reason)
    assert str(caught.value).startswith("cpu: ")


# --------------------------------------------------------------------------- format


@pytest.mark.parametrize(
    ("mib", "expected"),
    [
        (5120, "5GiB"),
        (1024, "1GiB"),
        (1536, "1536MiB"),
        (1, "1MiB"),
        (81920, "80GiB"),
        (144384, "141GiB"),
    ],
    ids=["five-gib", "one-gib", "not-whole-gib", "one-mib", "a100", "h200"],
)
def test_format_mib(mib: int, expected: str) -> None:
    assert format_mib(mib) == expected


@pytest.mark.parametrize("mib", [1, 512, 1536, 5120, 81920], ids=str)
def test_format_mib_round_trips(mib: int) -> None:
    assert parse_memory_mib(format_mib(mib)) == mib


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("1e1", "not a plain decimal number"),
        ("1_000", "not a plain decimal number"),
        ("0.9996", "a GPU fraction below 1 must be at most 0.999"),
    ],
    ids=["exponent", "underscore", "rounds-to-whole"],
)
def test_parse_gpu_request_rejects_forms_that_hide_the_value(text: str, reason: str) -> None:
    with pytest.raises(UnitError, match=reason):
        parse_gpu_request(text)


def test_parse_cpu_milli_rejects_underscores() -> None:
    with pytest.raises(UnitError, match="cpu: not a plain decimal number"):
        parse_cpu_milli("1_000")


def test_format_mib_zero() -> None:
    assert format_mib(0) == "0MiB"
