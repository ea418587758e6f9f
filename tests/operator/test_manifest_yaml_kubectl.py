"""``helmhive validate`` reads YAML as the real ``kubectl`` does: the same scalars, the same keys.

Each plain scalar (hand-picked edges and a seeded random batch of number-like and word-like
tokens) is written as a value and as a key; ``kubectl create --dry-run=client -o json`` prints
what it would send, and :class:`~helmhive.api.manifest_yaml.ManifestLoader` must read the same.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

import yaml

from harness.kubectl import Kubectl
from helmhive.api.manifest_yaml import ManifestLoader

EDGES = [
    "y",
    "Y",
    "n",
    "N",
    "yes",
    "No",
    "on",
    "OFF",
    "true",
    "False",
    "null",
    "Null",
    "~",
    "yep",
    "1:30",
    "190:20:30",
    "0o17",
    "017",
    "08",
    "08.5",
    "0x1F",
    "0x_1F",
    "-0x10",
    "0b101",
    "+0b11",
    "1_000",
    "1__0",
    "1.5_0",
    "1e3",
    "1E3",
    "1e+3",
    "1.0e3",
    "12e03",
    "+.5",
    ".5e2",
    "1e20",
    "1e21",
    "-1e-7",
    "0.000001",
    "123456789.123456789",
    "99999999999999999999",
    "18446744073709551615",
    "9223372036854775808",
    "-9223372036854775809",
    "1e400",
    "0o8",
    "0b2",
    "-0",
    "+1",
    "0.",
    "6.",
    "NaN",
    ".5_0",
    "1.2.3",
    "2027-01-15",
    "2027-1-5",
    "0x",
    "0b",
    "-",
    ".548_",
    "._5",
    ".5e1_0",
    ".5__0",
    ".5e400",
    ".e3",
    ".",
]
_ALPHABET = "0123456789+-._eExXoObB:yYnN"


def _tokens(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 7))) for _ in range(count)]


def _plain(token: str) -> bool:
    """Whether YAML reads ``token`` as one plain scalar, both as a value and as a key (else it is not a case)."""
    try:
        value = yaml.compose(f"v: {token}\n")
        key = yaml.compose(f"{token}: 1\n")
    except yaml.YAMLError:
        return False
    for node, index in ((value, 1), (key, 0)):
        if not isinstance(node, yaml.MappingNode) or len(node.value) != 1:
            return False
        scalar = node.value[0][index]
        if not isinstance(scalar, yaml.ScalarNode) or scalar.style is not None or scalar.value != token:
            return False
    return True


def _sendable(token: str) -> bool:
    """kubectl refuses a whole stream for one .inf value or one null key: those are tested apart."""
    try:
        yaml.load(f"v: {token}\n{token}: 1\n", Loader=ManifestLoader)
    except yaml.YAMLError:
        return False
    return True


def _stream(tokens: list[str]) -> str:
    docs = [
        f"apiVersion: helmhive.dev/v1alpha1\nkind: Workspace\nmetadata:\n  name: case-{i}\n"
        f"spec:\n  v: {token}\n  {token}: 1\n"
        for i, token in enumerate(tokens)
    ]
    return "---\n".join(docs)


def _objects(text: str) -> list[dict[str, Any]]:
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        obj, at = decoder.raw_decode(text, at)
        found += obj.get("items", [obj]) if obj.get("kind") == "List" else [obj]
    return found


def test_validate_reads_every_plain_scalar_and_key_as_kubectl_does(kubectl: Kubectl, crds: list[str]) -> None:
    seed = int(os.environ.get("HELMHIVE_FUZZ_SEED", "7"))
    candidates = list(dict.fromkeys([*EDGES, *_tokens(seed, 600)]))
    tokens = [t for t in candidates if _plain(t) and _sendable(t)]
    assert len(tokens) > 300, len(tokens)
    text = _stream(tokens)
    sent = _objects(
        kubectl("create", "--dry-run=client", "--validate=false", "-o", "json", "-f", "-", input=text).stdout
    )
    ours = [d for d in yaml.load_all(text, Loader=ManifestLoader) if d]
    assert len(sent) == len(ours) == len(tokens)
    differ = [
        (token, theirs["spec"], mine["spec"])
        for token, theirs, mine in zip(tokens, sent, ours, strict=True)
        if theirs["spec"] != mine["spec"] or json.dumps(theirs["spec"]) != json.dumps(mine["spec"], sort_keys=True)
    ]
    assert differ == [], differ[:40]
    kinds = {type(d["spec"]["v"]).__name__ for d in ours}
    assert {"bool", "int", "float", "str"} <= kinds, kinds  # the batch covered every outcome
    print(f"{len(tokens)} plain scalars, as values and keys: kubectl and helmhive validate read them alike")


def test_what_kubectl_refuses_to_send_validate_refuses_to_read(kubectl: Kubectl, crds: list[str]) -> None:
    for body in ("v: .inf", "v: -.Inf", "v: .nan", "~: 1", "null: 1"):
        text = f"apiVersion: helmhive.dev/v1alpha1\nkind: Workspace\nmetadata:\n  name: x\nspec:\n  {body}\n"
        proc = kubectl(
            "create", "--dry-run=client", "--validate=false", "-o", "json", "-f", "-", input=text, check=False
        )
        assert proc.returncode != 0 and "error converting YAML to JSON" in proc.stderr, (body, proc.stderr)
        try:
            list(yaml.load_all(text, Loader=ManifestLoader))
        except yaml.YAMLError as err:
            assert "kubectl refuses it" in str(err), err
        else:
            raise AssertionError(f"{body!r} was read, kubectl refuses it")


DOCUMENTS = [
    # Explicit tags, as go-yaml reads them.
    'a: !!bool "y"',
    'a: !!int "12"',
    "a: !!int 0o17",
    "a: !!float 1",
    'a: !!float "2.5"',
    "a: !!timestamp 2027-01-15",
    "a: !!binary aGVsbG8=",
    "a: !!set {x, y}",
    "a: !!omap [{x: 1}, {y: 2}]",
    "a: ! 12",
    "a: !foo x",
    "a: !foo {b: 1}",
    "a: !!str 08",
    'a: !!null ""',
    # Merges: in document order, the first of a list wins; "<<" elsewhere is a string.
    "a: {t: 120, <<: {t: 0}}",
    "a: {<<: {t: 0}, t: 120}",
    "a: {<<: [{t: 1}, {t: 2}], u: 3}",
    "b: &x {c: 1}\na: {<<: *x, d: 2}",
    "a: <<",
    "a: [<<]",
    # Not numbers to Go: spaces and non-ASCII digits.
    "a: 0 7",
    "a: + 5",
    "a: 0x 1F",
    "a: 1\u0662",
]
REFUSED = [
    'a: !!bool "yes please"',
    'a: !!int "y"',
    'a: !!float "abc"',
    'a: !!int ""',
    'a: !!timestamp "2027-13-45"',
    "a: !!float .inf",
    'a: !!binary "%%%"',
    "a: {<<: 5}",
    # A billion laughs, nine levels deep.
    "\n".join(
        ["x0: &a0 [x, x, x, x, x, x, x, x, x]"]
        + [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    ),
]


def _workspace(body: str) -> str:
    indented = body.replace("\n", "\n  ")
    return f"apiVersion: helmhive.dev/v1alpha1\nkind: Workspace\nmetadata:\n  name: x\nspec:\n  {indented}\n"


def test_tags_merges_and_odd_digits_read_as_kubectl_reads_them(kubectl: Kubectl, crds: list[str]) -> None:
    text = "---\n".join(_workspace(body).replace("name: x", f"name: doc-{i}") for i, body in enumerate(DOCUMENTS))
    sent = _objects(
        kubectl("create", "--dry-run=client", "--validate=false", "-o", "json", "-f", "-", input=text).stdout
    )
    ours = [d for d in yaml.load_all(text, Loader=ManifestLoader) if d]
    differ = [
        (body, theirs["spec"], mine["spec"])
        for body, theirs, mine in zip(DOCUMENTS, sent, ours, strict=True)
        if json.dumps(theirs["spec"], sort_keys=True) != json.dumps(mine["spec"], sort_keys=True)
    ]
    assert differ == []


def test_what_kubectl_cannot_decode_validate_cannot_either(kubectl: Kubectl, crds: list[str]) -> None:
    for body in REFUSED:
        text = _workspace(body)
        proc = kubectl(
            "create", "--dry-run=client", "--validate=false", "-o", "json", "-f", "-", input=text, check=False
        )
        assert proc.returncode != 0 and "error converting YAML to JSON" in proc.stderr, (body, proc.stderr)
        try:
            list(yaml.load_all(text, Loader=ManifestLoader))
        except yaml.YAMLError:
            continue
        raise AssertionError(f"{body[:60]!r} was read; kubectl cannot decode it")
