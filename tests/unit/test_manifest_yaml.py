"""Manifests read as kubectl reads them, and written so kubectl reads back what was meant.

``tests/operator/test_manifest_yaml_kubectl.py`` compares the loader with a real kubectl; these are
the rules by example, the dumper's round trip, and what ``helmhive validate`` now says.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from helmhive.api.manifest_yaml import ManifestDumper, ManifestLoader, decide_map_key, decide_plain_scalar
from helmhive.cli.main import app


def load(text: str) -> Any:
    return yaml.load(text, Loader=ManifestLoader)


@pytest.mark.parametrize(
    ("plain", "value"),
    [
        ("y", True),
        ("N", False),
        ("yes", True),
        ("Off", False),
        ("yep", "yep"),
        ("~", None),
        ("", None),
        ("1:30", "1:30"),  # PyYAML alone: 90 (base 60); go-yaml has no base 60
        ("0o17", 15),
        ("017", 15),
        ("08", 8),  # not octal, so go-yaml reads it as a float: 8.0, sent as 8
        ("08.5", 8.5),
        ("0x_1F", 31),
        ("0b101", 5),
        ("-0x10", -16),
        ("1_000", 1000),
        ("1e3", 1000),
        ("1.0e3", 1000),
        ("+.5", 0.5),
        (".5e2", 50),
        ("1e21", 1e21),  # Go writes it with an exponent: JSON keeps it a float
        ("1e20", 10**20),
        ("18446744073709551615", 18446744073709552000),  # uint64, then kubectl's float64
        ("99999999999999999999", 10**20),
        ("1e400", "1e400"),  # Go's ParseFloat overflows: a string
        ("0o8", "0o8"),
        ("-0", 0),
        ("NaN", "NaN"),
        ("2027-01-15", "2027-01-15"),
        ("2027-01-15T00:00:00Z", "2027-01-15T00:00:00Z"),
        ("1.5", 1.5),
        ("hello", "hello"),
    ],
)
def test_a_plain_scalar_is_what_kubectl_sends(plain: str, value: Any) -> None:
    got = decide_plain_scalar(plain)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("plain", [".inf", "-.Inf", ".nan"])
def test_what_json_cannot_hold_is_refused(plain: str) -> None:
    with pytest.raises(ValueError, match="not a number JSON can hold"):
        decide_plain_scalar(plain)
    with pytest.raises(yaml.YAMLError, match="kubectl refuses it too"):
        load(f"spec: {{x: {plain}}}")


def test_keys_become_the_strings_kubectl_makes() -> None:
    assert load("{y: a, 1: b, 1.5: c, 1e3: d, 1e23: e, on: f, 0.1: g, -0: h}") == {
        "true": "f",  # on is true too, and the later key wins, as in kubectl
        "1": "b",
        "1.5": "c",
        "1000": "d",
        "1e+23": "e",
        "0.1": "g",
        "0": "h",
    }
    assert [decide_map_key(k) for k in (True, False, 7, 1234567.0, 1e-5, math.inf)] == [
        "true",
        "false",
        "7",
        "1.234567e+06",
        "1e-05",
        ".inf",
    ]
    with pytest.raises(yaml.YAMLError, match="kubectl refuses it"):
        load("{~: a}")


def test_quoted_and_tagged_scalars_stay_strings_and_merge_keys_work() -> None:
    doc = load("base: &b {x: '1e3', q: \"y\", z: !!str 08}\nmerged:\n  <<: *b\n  w: 1e3\n")
    assert doc["merged"] == {"x": "1e3", "q": "y", "z": "08", "w": 1000}


# Printable text: PyYAML itself does not round-trip a bare line separator such as U+0085.
_TEXT = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters="\x85\ufeff"), max_size=12
)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer())
    | _TEXT
    | st.sampled_from(["y", "N", "on", "1e3", "08", "0o17", "+.5", "1:30", "~", "null", "1_0", ".inf", "<<", "0 7"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)


@given(_JSON)
def test_what_the_dumper_writes_reads_back_as_itself(doc: Any) -> None:
    text = yaml.dump(doc, Dumper=ManifestDumper, allow_unicode=True)
    assert load(text) == doc


def test_the_generated_crds_read_the_same_either_way() -> None:
    # Written by the dumper: nothing in them is a string kubectl would read as something else.
    for path in sorted((Path(__file__).parents[2] / "crds").glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        assert load(text) == yaml.safe_load(text), path.name


def test_validate_reads_a_bare_y_as_kubectl_does(tmp_path: Path) -> None:
    pool = {
        "apiVersion": "helmhive.dev/v1alpha1",
        "kind": "RunnerPool",
        "metadata": {"name": "p"},
        "spec": {
            "provider": "anthropic",
            "adapter": {"type": "claude-cli"},
            "image": "ghcr.io/helmhive/runner:0.1.0",
            "credential": {"secretRef": {"name": "key", "key": "api-key"}},
            "placementLabels": {"tier": "TIER"},
        },
    }
    text = yaml.safe_dump(pool, sort_keys=False)
    bare = tmp_path / "bare.yaml"
    bare.write_text(text.replace("TIER", "y"), encoding="utf-8")  # kubectl sends true: not a string
    quoted = tmp_path / "quoted.yaml"
    quoted.write_text(text.replace("TIER", "'y'"), encoding="utf-8")
    refused = CliRunner().invoke(app, ["validate", str(bare), "-o", "json"])
    assert refused.exit_code == 1, refused.stdout
    (issue,) = json.loads(refused.stdout)["issues"]
    assert issue["fieldPath"] == "spec.placementLabels.tier", issue
    accepted = CliRunner().invoke(app, ["validate", str(quoted)])
    assert accepted.exit_code == 0, accepted.stdout


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("a: {t: 120, <<: {t: 0}}", {"t": 0}),  # go-yaml: in document order, the later wins
        ("a: {<<: [{t: 1}, {t: 2}], u: 3}", {"t": 1, "u": 3}),  # of a list, the first wins
        ("a: <<", "<<"),
        ('a: !!bool "y"', True),
        ("a: !!float 1", 1),
        ("a: !!binary aGVsbG8=", "hello"),
        ("a: ! 12", "12"),
        ("a: !foo {b: 1}", {"b": 1}),
        ("a: !!set {x}", {"x": None}),
        ("a: 0 7", "0 7"),
        ("a: 1\u0662", "1\u0662"),  # not an ASCII digit: not a number to Go
    ],
)
def test_merges_tags_and_digits_by_example(text: str, value: Any) -> None:
    assert load(text)["a"] == value


@pytest.mark.parametrize("text", ['a: !!int "y"', "a: !!timestamp 2027-13-45", 'a: !!binary "%%"', "a: {<<: 5}"])
def test_what_go_yaml_cannot_decode_is_refused(text: str) -> None:
    with pytest.raises(yaml.YAMLError):
        load(text)


def test_a_billion_laughs_is_refused_before_it_is_expanded() -> None:
    levels = ["x0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    with pytest.raises(yaml.YAMLError, match="excessive aliasing"):
        load("\n".join(levels))
    shared = "base: &b {c: 1}\n" + "\n".join(f"k{i}: *b" for i in range(1000))
    assert load(shared)["k999"] == {"c": 1}  # ordinary reuse of an anchor is fine


def test_the_dumper_quotes_a_merge_key() -> None:
    text = yaml.dump({"<<": "x", "a": "<<"}, Dumper=ManifestDumper)
    assert load(text) == {"<<": "x", "a": "<<"}
