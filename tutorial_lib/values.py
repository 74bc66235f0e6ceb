"""How a value is read and written: the text of a command line, a YAML file or a Python value turned into a
TrainConfig field's type (`coerce`), with an error that names the field; a value written back as a command line
writes it (`format_value`); one line of plain text (`check_one_line`); a mistyped name's suggestion; the strict
YAML reader of config files; a number of things in words (`count`: 1 GPU, 2 GPUs). Torch-free, like `config`, which builds on it."""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError


def count(n: int | str, noun: str, plural: str | None = None) -> str:
    """'1 GPU', '2 GPUs', '0 GPUs': a number (or the text of one, as Slurm reports it) with its noun (`plural`
    where adding an s is wrong)."""
    number = f"{n:,}" if isinstance(n, int) else str(n)
    return f"{number} {noun if number == '1' else plural or noun + 's'}"


def suggest(word: str, known) -> str:
    """' (did you mean 'x'?)' for a mistyped name, or ''."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_yaml(p: Path, configs: Path) -> dict[str, Any]:
    """A config file's `key: value` mapping; every way it can be wrong is a ConfigError naming the file and the
    fix (`configs`: the folder of the workbook's named configs, which the message lists)."""
    named = ", ".join(sorted(c.name for c in configs.glob("*.yaml")))
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a folder; give a YAML file in it (the workbook's: {named})")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; check the path (the workbook's named configs: "
                          f"{named})")
    try:
        loaded = yaml.load(p.read_text(encoding="utf-8"), Loader=_strict_loader()) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" at line {where.line + 1}" if where else ""
        raise ConfigError(f"config file {str(p)!r} is not valid YAML{line} ({getattr(e, 'problem', None) or e}); "
                          "write one `key: value` per line and quote values holding ': ' or ' #'") from None
    except OSError as e:
        raise ConfigError(f"config file {str(p)!r} can't be read ({e.strerror}); check its permissions") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of key: value, not {type(loaded).__name__}")
    return loaded


def _strict_loader():
    """YAML's safe loader without YAML 1.1's number surprises: `12:30` (base 60), `0x1F`, `0o17` and `012`
    (octal) stay text, which the field's type then reads or refuses; `1e-3` is a number."""
    class Loader(yaml.SafeLoader):
        pass
    int_tag, float_tag = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
    Loader.yaml_implicit_resolvers = {first: [(tag, rx) for tag, rx in rules if tag not in (int_tag, float_tag)]
                                      for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver(int_tag, re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
    number = r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"
    Loader.add_implicit_resolver(float_tag, re.compile(number), list("-+0123456789."))
    Loader.add_constructor(int_tag, lambda loader, node: int(loader.construct_scalar(node)))  # 012 is 12
    return Loader


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}")


def check_positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive integer")


def format_value(value: Any) -> str:
    """A value as it is written on a command line: null, true/false, or str()."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
INT_RE = re.compile(r"[+-]?[0-9]+")


def is_whole(text: Any) -> bool:
    """Whether `text` is a whole number >= 0 in the digits 0-9 (spaces around it allowed): what a launcher's
    variable or a count holds. Not str.isdigit(), which also takes '²' (int() then fails) and '٣' (int() reads 3)."""
    return bool(re.fullmatch(r"\s*[0-9]+\s*", str(text)))


def check_one_line(field_name: str, value: str) -> str:
    """Text that goes into a job file or a log line: no newline, carriage return or other control character
    (a newline would end the comment or the quoted word the text is written into)."""
    if CONTROL_RE.search(value):
        raise ConfigError(f"{field_name}={value!r} contains a control character "
                          f"({CONTROL_RE.search(value).group()!r}); give it as one line of plain text")
    return value


def coerce(f: dataclasses.Field, value: Any) -> Any:
    """Turn a Python, YAML or command-line value into the field's type, with an error that names the field.
    Text (a command-line override, or a str given in Python) is read by the field's type: a string field keeps
    it as typed; an int takes decimal digits only (no 0x1F, no 12:30); a float what float() reads; a bool
    true/false/yes/no/on/off/1/0; `null` is None where the field allows None."""
    kind = str(f.type)
    expected = kind.split(" ")[0]
    if isinstance(value, str) and value.strip() == "null" and ("None" in kind or expected != "str"):
        value = None  # a string field keeps the text "null"
    if value is None:
        if "None" in kind:
            return None
        article = "an" if expected == "int" else "a"
        raise ConfigError(f"{f.name}=None is not allowed; give {article} {expected} (default {format_value(f.default)})")
    typed = {"bool": _as_bool, "int": _as_int, "float": _as_float, "str": _as_str}[expected](value)
    if typed is None and kind in ("int | str", "bool | str") and isinstance(value, str):
        typed = value.strip()  # a word (num_workers=auto, cudnn_benchmark=force); validate() says which it takes
    if typed is None:
        example = {"bool": "true or false", "int": "a whole number in decimal digits, e.g. 64",
                   "float": "a number, e.g. 0.001", "str": "text"}[expected]
        raise ConfigError(f"{f.name}={value!r} is not a valid {expected}; give {example}")
    if expected == "float" and not math.isfinite(typed):
        raise ConfigError(f"{f.name}={value!r} is not a finite number; give e.g. {format_value(f.default)}")
    if expected == "str":
        check_one_line(f.name, typed)
    return typed


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower() if isinstance(value, (str, int)) else None
    return {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False,
            "0": False}.get(word)


def _as_int(value: Any) -> int | None:
    if isinstance(value, str):
        return int(value) if INT_RE.fullmatch(value.strip()) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _as_str(value: Any) -> str | None:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # YAML read `out_dir: 2024` as a number
    return None


def step_label(name: str) -> str:
    """'ProfilerStep#7' -> 'step 8': torch.profiler counts steps from 0, the training's log and a learner from 1."""
    m = re.fullmatch(r"ProfilerStep#(\d+)", name)
    return f"step {int(m.group(1)) + 1}" if m else name
