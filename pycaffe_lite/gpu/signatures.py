"""Kernel signatures read from CUDA source, so Python call sites never spell argument types.

:func:`parse_signatures` finds every ``__global__`` entry point of a ``.cu`` source (after
expanding the file's own ``#define`` macros, which some files use to stamp out tile variants) and
returns its parameters as :class:`Param` (name and kind). :func:`check_args` validates a call's
arguments against a signature and names the kernel and the argument that does not fit. Pure
Python: importing or testing this module needs no GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# kind -> (struct format code for PyCUDA's prepared calls, human name). "scalar" is the file's
# Dtype (chosen per compile), "mscalar" its Mtype (float for the half types, else Dtype).
KINDS = {
    "ptr": ("P", "device pointer"),
    "int": ("i", "int32"),
    "uint": ("I", "uint32"),
    "int64": ("q", "int64"),
    "uint64": ("Q", "uint64"),
    "float": ("f", "float"),
    "double": ("d", "double"),
    "scalar": ("", "Dtype scalar"),
    "mscalar": ("", "Mtype scalar"),
}

_SCALAR_TYPES = {
    "int": "int", "bool": "int", "int32_t": "int",
    "unsigned": "uint", "unsigned int": "uint", "uint32_t": "uint",
    "long long": "int64", "long long int": "int64", "int64_t": "int64",
    "unsigned long long": "uint64", "uint64_t": "uint64", "size_t": "uint64",
    "float": "float", "double": "double", "Dtype": "scalar", "Mtype": "mscalar",
}


class SignatureError(ValueError):
    """A ``__global__`` parameter list this module cannot map to argument kinds."""


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # a key of KINDS


@dataclass(frozen=True)
class Signature:
    name: str
    params: tuple[Param, ...]

    def struct_codes(self, scalar_code: str, mscalar_code: str | None = None) -> str:
        """PyCUDA ``prepare`` codes; ``scalar_code`` is the file's Dtype's (``f``, ``d``, ``e``, ``H``),
        ``mscalar_code`` its Mtype's (default: ``scalar_code``, as for float and double)."""
        codes = {"scalar": scalar_code, "mscalar": mscalar_code or scalar_code}
        return "".join(KINDS[p.kind][0] or codes[p.kind] for p in self.params)

    @property
    def counts_items(self) -> bool:
        """True when the first parameter is an int: the grid-stride work-item count."""
        return bool(self.params) and self.params[0].kind == "int"


_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(\([^)]*\))?[ \t]*(.*)$")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _collect_macros(text: str) -> tuple[dict[str, tuple[list[str] | None, str]], str]:
    """(name -> (params or None, body)) of the file's #defines, and the text without them."""
    macros: dict[str, tuple[list[str] | None, str]] = {}
    out: list[str] = []
    lines = text.replace("\\\r\n", "\\\n").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _DEFINE.match(line)
        if not m:
            out.append(line)
            i += 1
            continue
        body = m.group(3)
        while body.endswith("\\") and i + 1 < len(lines):
            i += 1
            body = body[:-1] + " " + lines[i]
        params = [p.strip() for p in m.group(2)[1:-1].split(",")] if m.group(2) else None
        macros[m.group(1)] = (params, body)
        i += 1
    return macros, "\n".join(out)


def _split_args(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _expand(text: str, macros: dict[str, tuple[list[str] | None, str]], depth: int = 0) -> str:
    if depth > 8 or not macros:
        return text
    names = "|".join(re.escape(n) for n in sorted(macros, key=len, reverse=True))
    pattern = re.compile(rf"\b({names})\b")
    result, pos, changed = [], 0, False
    while True:
        m = pattern.search(text, pos)
        if m is None:
            break
        params, body = macros[m.group(1)]
        end = m.end()
        if params is not None:  # function-like: needs a parenthesised argument list
            j = end
            while j < len(text) and text[j] in " \t\n":
                j += 1
            if j >= len(text) or text[j] != "(":
                result.append(text[pos:end])
                pos = end
                continue
            level, k = 0, j
            while k < len(text):
                level += text[k] == "("
                level -= text[k] == ")"
                if level == 0:
                    break
                k += 1
            args = _split_args(text[j + 1 : k])
            for p, a in zip(params, args):
                body = re.sub(rf"\b{re.escape(p)}\b", a, body)
            end = k + 1
        result.append(text[pos : m.start()])
        result.append(re.sub(r"\s*##\s*", "", body))
        pos, changed = end, True
    result.append(text[pos:])
    out = "".join(result)
    return _expand(out, macros, depth + 1) if changed else out


_GLOBAL = re.compile(
    r"(template\s*<[^>]*>\s*)?__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)"
)


def _param(kernel: str, text: str) -> Param:
    text = re.sub(r"\b(const|volatile|__restrict__|__restrict|restrict)\b", " ", text)
    text = " ".join(text.replace("*", " * ").split())
    tokens = text.split(" ")
    if len(tokens) < 2:
        raise SignatureError(f"kernel {kernel}: cannot read parameter '{text}'")
    name = tokens[-1]
    ctype = " ".join(tokens[:-1])
    if "*" in ctype:
        return Param(name, "ptr")
    kind = _SCALAR_TYPES.get(ctype)
    if kind is None:
        raise SignatureError(f"kernel {kernel}: parameter '{name}' has type '{ctype}', which cannot be passed "
                             "from Python (use pointers, int, unsigned, long long, float, double, Dtype or Mtype)")
    return Param(name, kind)


def parse_signatures(source: str) -> dict[str, Signature]:
    """Every non-template ``__global__`` function of ``source``: name -> :class:`Signature`."""
    macros, rest = _collect_macros(_strip_comments(source))
    text = _expand(rest, macros)
    sigs: dict[str, Signature] = {}
    for m in _GLOBAL.finditer(text):
        if m.group(1):  # templates have no unmangled entry point
            continue
        name, plist = m.group(2), m.group(3).strip()
        params = () if plist in ("", "void") else tuple(_param(name, p) for p in _split_args(plist))
        sigs[name] = Signature(name, params)
    return sigs


def check_args(sig: Signature, args: tuple, where: str = "") -> None:
    """Raise TypeError/ValueError naming the kernel and argument when ``args`` don't fit ``sig``."""
    label = f"kernel {sig.name}" + (f" ({where})" if where else "")
    if len(args) != len(sig.params):
        names = ", ".join(p.name for p in sig.params)
        raise TypeError(f"{label}: takes {len(sig.params)} arguments ({names}), got {len(args)}")
    for pos, (param, value) in enumerate(zip(sig.params, args)):
        kind = param.kind
        what = f"{label}: argument {pos} '{param.name}' ({KINDS[kind][1]})"
        if kind == "ptr":
            try:
                ptr = int(value)
            except (TypeError, ValueError):
                raise TypeError(f"{what} got {type(value).__name__}, not a device pointer") from None
            if ptr == 0:
                raise ValueError(f"{what} is a null device pointer")
        elif kind in ("float", "double", "scalar", "mscalar"):
            if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
                raise TypeError(f"{what} got {type(value).__name__}, expected a number")
        else:
            if isinstance(value, float) and not value.is_integer():
                raise TypeError(f"{what} got the non-integer {value}")
            try:
                v = int(value)
            except (TypeError, ValueError):
                raise TypeError(f"{what} got {type(value).__name__}, expected an integer") from None
            lo, hi = {"int": (INT32_MIN, INT32_MAX), "uint": (0, 2**32 - 1),
                      "int64": (-(2**63), 2**63 - 1), "uint64": (0, 2**64 - 1)}[kind]
            if not lo <= v <= hi:
                raise ValueError(f"{what} = {v} does not fit")
