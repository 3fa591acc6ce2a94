"""Element-wise CUDA statements written on ``Dtype`` rewritten to compute in ``Mtype``.

A statement string such as NeuronLayer's ``"y[i] = x[i] > 0 ? x[i] : x[i] * negative_slope"`` is
CUDA over device arrays of the storage type ``Dtype``. For float and double that is also the math
type; for the half types (``__half``, ``__nv_bfloat16``) arithmetic must run in ``Mtype`` (float),
so :func:`in_math` rewrites a body as the kernel-file convention asks (docs/precision.md,
"Kernels"): every element read of a named array becomes ``to_m(a[...])``, every store
``a[...] = e`` becomes ``a[...] = from_m(e)`` (``a[...] op= e``: ``a[...] = from_m(to_m(a[...]) op (e))``)
and every other ``Dtype`` (local declarations, literals such as ``Dtype(0)``) becomes ``Mtype``.
For float and double ``to_m`` and ``from_m`` are identities and ``Mtype`` is ``Dtype``, so the
statement computes exactly what it computed before. Pure Python: no GPU needed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

_STORE = re.compile(r"^(\s*)(\w+)(\[)")


def _split_statements(body: str) -> list[str]:
    """``body`` split at its top-level semicolons (none inside brackets or parentheses)."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in body:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == ";" and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _close(text: str, start: int) -> int:
    """Index just past the ``]`` matching the ``[`` at ``start``."""
    depth = 0
    for k in range(start, len(text)):
        depth += text[k] == "["
        depth -= text[k] == "]"
        if depth == 0:
            return k + 1
    raise ValueError(f"unbalanced '[' in statement: {text!r}")


def _reads(expr: str, names: tuple[str, ...]) -> str:
    """``expr`` with every element access of ``names`` wrapped in ``to_m(...)`` and ``Dtype`` → ``Mtype``."""
    if not names:
        return re.sub(r"\bDtype\b", "Mtype", expr)
    pattern = re.compile(rf"\b({'|'.join(map(re.escape, names))})\s*\[")
    out, pos = [], 0
    while (m := pattern.search(expr, pos)) is not None:
        end = _close(expr, m.end() - 1)
        out.append(re.sub(r"\bDtype\b", "Mtype", expr[pos:m.start()]))
        out.append(f"to_m({expr[m.start():end]})")
        pos = end
    out.append(re.sub(r"\bDtype\b", "Mtype", expr[pos:]))
    return "".join(out)


@functools.cache
def _in_math(body: str, names: tuple[str, ...]) -> str:
    statements = []
    for stmt in _split_statements(body):
        m = _STORE.match(stmt)
        assign = None
        if m is not None and m.group(2) in names:
            end = _close(stmt, m.end(3) - 1)
            target, rest = stmt[m.start(2):end], stmt[end:]
            assign = re.match(r"\s*([-+*/]?)=(?!=)\s*", rest)
        if m is not None and assign is not None:
            value = _reads(rest[assign.end():], names)
            op = assign.group(1)
            if op:
                value = f"{_reads(target, names)} {op} ({value})"
            statements.append(f"{m.group(1)}{target} = from_m({value})")
        else:
            statements.append(_reads(stmt, names))
    return ";".join(statements)


def in_math(body: str, arrays: Iterable[str]) -> str:
    """``body`` (statements over the ``Dtype`` device arrays ``arrays``) computing in ``Mtype``:
    loads through ``to_m``, stores through ``from_m``, ``Dtype`` elsewhere spelled ``Mtype``.
    Scalars the body names are the caller's to declare ``Mtype``."""
    return _in_math(body, tuple(arrays))
