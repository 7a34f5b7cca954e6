"""Read YAML/JSON documents field by field, so every error names the file and the field path.

    f = Fields.load("cluster.yaml")
    for node in f.list("nodes"):
        node.number("memory_gib", positive=True)   # -> "cluster.yaml: nodes[2].memory_gib: missing"
"""

from __future__ import annotations

import json
import numbers
import re
from pathlib import Path
from typing import Any, Iterable

import yaml

from hetsim.errors import SpecError

__all__ = ["Fields", "read_document", "read_text", "parse_document", "dump_yaml", "is_real", "is_whole", "LARGEST"]

_MISSING = object()
# No count of bytes, FLOPs, seconds or GB/s in these files comes near this: a larger number is a typo,
# and would overflow floats once converted to SI units and summed.
LARGEST = 1e30


def is_real(value: Any) -> bool:
    """A number given in Python (a bool is not one, though Python counts it as an int)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_whole(value: Any) -> bool:
    """A whole number given in Python (not a bool, nor a float that happens to be whole)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def read_document(path: str | Path) -> Any:
    """Parse a .yaml/.yml/.json file; parse errors become one-line SpecErrors naming the file."""
    return parse_document(read_text(path, "UTF-8 YAML or JSON"), path)


def read_text(path: str | Path, expected: str) -> str:
    """The file's UTF-8 text; a missing, unreadable or binary file is a one-line SpecError naming it
    and what it should have held (`expected`)."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file (expected {expected})") from None


def parse_document(text: str, path: str | Path) -> Any:
    """Parse JSON when `path` ends in .json or the text is a JSON document (a plan saved under
    another name), YAML otherwise; any failure is a one-line SpecError."""
    path = Path(path)
    try:
        if path.suffix == ".json":
            return json.loads(text, object_pairs_hook=_unique_json_keys)
        if text.lstrip(" \t\r\n\ufeff").startswith(("{", "[")):
            try:
                return json.loads(text.lstrip("\ufeff"), object_pairs_hook=_unique_json_keys)
            except json.JSONDecodeError:
                pass                     # YAML's flow style starts so too: {a: 1}
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as exc:
        raise SpecError(f"{path}: {exc.where}key {exc.key!r} is given twice (which one did you mean?)") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: line {exc.lineno}: invalid JSON ({exc.msg})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise SpecError(f"{path}: {where}{problem}") from None
    except (ValueError, RecursionError) as exc:   # e.g. an integer of more than 4300 digits, deep nesting
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecError(f"{path}: cannot parse ({reason})") from None


class _DuplicateKey(Exception):
    def __init__(self, key: Any, where: str = ""):
        super().__init__(key)
        self.key, self.where = key, where


def _unique_json_keys(pairs: list[tuple[str, Any]]) -> dict:
    """json's object hook: a key given twice is an error, not the last one silently kept."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a mapping giving a key twice is an error (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            # The mapping's own scalar keys; a merge ("<<: *anchor") may be overridden, as YAML intends.
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise _DuplicateKey(key, f"line {key_node.start_mark.line + 1}: ")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _Dumper(yaml.SafeDumper):
    """yaml.safe_dump, except that text reading as a number to the loader above is quoted."""


# YAML 1.2's floats: PyYAML (YAML 1.1) reads 1e-3 and 1e5, which have no dot, as text. The dumper
# learns the same rule, so that a name such as "1e5" is written quoted and reads back as text.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
for _cls in (_UniqueKeyLoader, _Dumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


def dump_yaml(data: Any, **options: Any) -> str:
    """yaml.safe_dump for documents hetsim reads back (parse_document): same options, same output,
    except that text the reader would take for a number is quoted."""
    return yaml.dump(data, Dumper=_Dumper, **options)


class Fields:
    """A mapping from a document, with the file name and the path to it for error messages."""

    def __init__(self, data: Any, source: str, path: str = ""):
        if not isinstance(data, dict):
            raise SpecError(f"{source}: {path or 'document'}: expected a mapping, got {_kind(data)}")
        self.data = data
        self.source = source
        self.path = path

    @classmethod
    def load(cls, path: str | Path) -> "Fields":
        return cls(read_document(path), Path(path).name)

    def where(self, key: str | None = None) -> str:
        if key is None:
            return self.path or "document"
        key = key if key and key.isprintable() and key.strip() == key else repr(key)   # one line, visible
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str | None, message: str) -> SpecError:
        return SpecError(f"{self.source}: {self.where(key)}: {message}")

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        if not self.has(key):
            if default is _MISSING:
                raise self.error(key, "missing")
            return default
        return self.data[key]

    def text(self, key: str, default: Any = _MISSING, *, choices: Iterable[str] | None = None) -> str:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str):
            raise self.error(key, f"expected text, got {_kind(value)}")
        if choices is not None and value not in choices:
            raise self.error(key, f"{value!r} is not one of {', '.join(sorted(choices))}")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def number(self, key: str, default: Any = _MISSING, *, positive: bool = False,
               nonnegative: bool = False, integer: bool = False) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"expected a number, got {_kind(value)}")
        if not abs(value) <= LARGEST:                  # also NaN and infinities
            raise self.error(key, f"expected a finite number of magnitude at most {LARGEST:g}, "
                             f"got {_number(value)}")
        if integer and not float(value).is_integer():
            raise self.error(key, f"expected a whole number, got {value}")
        if positive and not value > 0:
            raise self.error(key, f"must be > 0, got {value}")
        if nonnegative and not value >= 0:
            raise self.error(key, f"must be >= 0, got {value}")
        return int(value) if integer else float(value)

    def sub(self, key: str, default: Any = _MISSING) -> "Fields | Any":
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, dict):
            raise self.error(key, f"expected a mapping, got {_kind(value)}")
        return Fields(value, self.source, self.where(key))

    def list(self, key: str, default: Any = _MISSING) -> list:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, list):
            raise self.error(key, f"expected a list, got {_kind(value)}")
        return value

    def records(self, key: str, default: Any = _MISSING) -> "list[Fields]":
        items = self.list(key, default)
        if items is default and default is not _MISSING:
            return items
        if not items:
            raise self.error(key, "must not be empty")
        out = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise self.error(f"{key}[{i}]", f"expected a mapping, got {_kind(item)}")
            out.append(Fields(item, self.source, self.where(f"{key}[{i}]")))
        return out

    def reject_unknown(self, allowed: Iterable[str]) -> None:
        """Typos must not silently fall back to defaults."""
        allowed = set(allowed)
        for key in self.data:
            if key not in allowed:
                raise self.error(str(key), f"unknown field (expected one of: {', '.join(sorted(allowed))})")


def _number(value: float) -> str:
    try:
        return f"{value:g}"
    except OverflowError:                       # an int beyond floats
        return f"about 2**{abs(value).bit_length()}"


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: f"text {value!r}", bool: f"{value}"}.get(
        type(value), repr(value))
