"""Reading a user's YAML file so that a syntax error names the file, the line and the column.

``yaml.safe_load(path.read_text())`` reports ``ScannerError(None, None, ...)``, ``in "<unicode string>"``:
neither the file nor, in a one-line log, where in it. Every loader of a configuration file goes through
:func:`load_yaml_file` (its callers wrap :class:`YamlFileError` in their own error type where they have one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class YamlFileError(ValueError):
    """A YAML file that does not parse; the message reads ``FILE: not valid YAML at line L, column C: ...``."""


def yaml_error_message(path: str | Path, err: yaml.YAMLError) -> str:
    """One line naming ``path``, the 1-based line and column of the problem, what PyYAML found there and the
    offending line's text."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    what = "; ".join(str(x) for x in (getattr(err, "context", None), getattr(err, "problem", None)) if x)
    what = what or str(err).replace("\n", " ")
    if mark is None:
        return f"{path}: not valid YAML: {what}"
    lines = mark.buffer.split("\n") if isinstance(getattr(mark, "buffer", None), str) else []
    text = lines[mark.line].rstrip("\0") if mark.line < len(lines) else ""
    return (f"{path}: not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {what}"
            + (f" (the line reads {text[:80]!r})" if text else ""))


def load_yaml_file(path: str | Path) -> Any:
    """The file's YAML document (``yaml.safe_load``); a syntax error raises :class:`YamlFileError` naming the
    file, line and column. A missing or unreadable file raises the OSError ``open`` raises (it names the path)."""
    p = Path(path)
    text = p.read_text()
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise YamlFileError(yaml_error_message(p, e)) from None
