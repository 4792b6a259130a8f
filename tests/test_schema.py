"""polyforge.schema: the one set of YAML field readers; every failure is one BadInput line
naming the file and the key as the file spells it."""

from __future__ import annotations

import re

import pytest

from polyforge import schema
from polyforge.errors import BadInput

WHERE = "gates/g.yaml"


def _fails(fragment: str, read, *args, **kwargs) -> str:
    with pytest.raises(BadInput) as info:
        read(*args, **kwargs)
    message = info.value.message
    assert fragment in message and message.startswith(WHERE) and "\n" not in message, message
    assert info.value.exit_code == 2
    return message


def test_need_and_optional():
    values = {"name": "x", "timeout": 5, "flag": True, "empty": None}
    assert schema.need(values, "name", str, WHERE) == "x"
    assert schema.optional(values, "timeout", (int, float), WHERE, 1800) == 5
    assert schema.optional(values, "absent", int, WHERE, 1800) == 1800
    assert schema.optional(values, "empty", str, WHERE, "d") == "d"  # a null value reads as absent
    _fails("missing 'absent'", schema.need, values, "absent", str, WHERE)
    _fails("missing 'params.empty'", schema.need, values, "empty", str, WHERE, section="params")
    _fails("'name' must be an integer (got str)", schema.need, values, "name", int, WHERE)
    # YAML's true is not a number
    _fails("'params.flag' must be a number (got bool)", schema.optional, values, "flag", (int, float), WHERE,
           section="params")


def test_choice():
    assert schema.choice({"mode": "grad"}, "mode", ("test", "grad"), WHERE, "test") == "grad"
    assert schema.choice({}, "mode", ("test", "grad"), WHERE, "test") == "test"
    _fails("'params.mode' must be one of test, grad (got 'perf')", schema.choice, {"mode": "perf"}, "mode",
           ("test", "grad"), WHERE, "test", section="params")
    _fails("'kind' must be one of a, b (got None)", schema.choice, {}, "kind", ("a", "b"), WHERE)


def test_str_list():
    assert schema.str_list({}, "models", WHERE) == []
    assert schema.str_list({"models": ["a", "b"]}, "models", WHERE) == ["a", "b"]
    assert schema.str_list({"argv": ["-t", 2]}, "argv", WHERE, numbers_as_text=True) == ["-t", "2"]
    _fails("'models' must be a list of strings", schema.str_list, {"models": ["a", 1]}, "models", WHERE)
    _fails("'models' must be a list of strings", schema.str_list, {"models": "a"}, "models", WHERE)
    _fails("'argv' must be a list of strings", schema.str_list, {"argv": [True]}, "argv", WHERE, numbers_as_text=True)
    _fails("'thresholds' must be a non-empty list of strings", schema.str_list, {"thresholds": []}, "thresholds",
           WHERE, required=True)
    _fails("'thresholds' must be a non-empty list", schema.str_list, {}, "thresholds", WHERE, required=True)


def test_str_map():
    name = re.compile(r"^[A-Z_]+$")
    assert schema.str_map({}, "env", WHERE) == {}
    assert schema.str_map({"env": {"A": 1, "B": "x"}}, "env", WHERE, key_pattern=name) == {"A": "1", "B": "x"}
    _fails("'env' must map names to strings or numbers", schema.str_map, {"env": ["A=1"]}, "env", WHERE)
    _fails("'env' must map names to strings or numbers", schema.str_map, {"env": {"A": False}}, "env", WHERE)
    _fails("'env': '1a' is not a valid name", schema.str_map, {"env": {"1a": "x"}}, "env", WHERE, key_pattern=name)


def test_mapping_only_and_hex():
    assert schema.mapping({"a": 1}, WHERE) == {"a": 1}
    _fails("must be a mapping (got list)", schema.mapping, [1, 2], WHERE)
    _fails("'build' must be a mapping (got str)", schema.mapping, "x", WHERE, "build")
    schema.only({"targets": []}, ("targets", "requires"), WHERE, section="build")
    _fails("unknown key(s) build.target (allowed: requires, targets)", schema.only, {"target": []},
           ("targets", "requires"), WHERE, section="build")
    assert schema.hex_digest("a" * 40, 40, WHERE, "commit") == "a" * 40
    _fails("'commit' is not a lowercase hex digest", schema.hex_digest, "A" * 40, 40, WHERE, "commit")
    _fails("'sha256' is not a lowercase hex digest", schema.hex_digest, "a" * 40, 64, WHERE, "sha256")


def test_load_yaml(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("a: [1, 2]\n")
    assert schema.load_yaml(path) == {"a": [1, 2]}
    path.write_text("a: [\n")
    with pytest.raises(BadInput, match="g.yaml: not valid YAML"):
        schema.load_yaml(path)
    path.write_bytes(b"a: caf\xe9\n")
    with pytest.raises(BadInput, match="g.yaml: not UTF-8"):
        schema.load_yaml(path)
    with pytest.raises(FileNotFoundError):  # what a missing file means is the caller's to say
        schema.load_yaml(tmp_path / "nope.yaml")


# -- the three YAML inputs read through it ----------------------------------------------------
@pytest.mark.parametrize("text, fragment", [
    ("cuda: {fa_quants: []}\n", "'cuda.fa_quants' must be a non-empty list of strings"),
    ("cuda: [1]\n", "'cuda' must be a mapping"),
    ("cuda: {fa_quants: [q8_0]}\n", "'cuda.fa_quants' entry 'q8_0' is not <type_K>-<type_V>"),
])
def test_build_yaml_errors_name_the_key(tmp_path, text, fragment):
    from polyforge.build import builder as build_lib
    (tmp_path / "build.yaml").write_text(text)
    with pytest.raises(BadInput, match=re.escape(fragment)) as info:
        build_lib.load_fa_pairs(tmp_path)
    assert "build.yaml" in info.value.message


def test_pin_errors_name_the_key(tmp_path):
    from polyforge.upstream.pin import Pin
    path = tmp_path / "pin.yaml"
    path.write_text("upstream: {release: b1, commit: %s}\nsources: [{name: a, kind: dir, location: /x}]\n" % ("a" * 40))
    with pytest.raises(BadInput, match="pin.yaml: missing 'upstream.tree'"):
        Pin.load(path)
    path.write_text("upstream: {release: b1, commit: %s, tree: %s}\nsources: [{name: a, kind: dir, location: /x}]\n"
                    "pack: {tree: XYZ}\n" % ("a" * 40, "b" * 40))
    with pytest.raises(BadInput, match="'pack.tree' is not a lowercase hex digest"):
        Pin.load(path)
