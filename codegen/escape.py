"""Every user string that generated code carries goes through here: validated or escaped.

A name that becomes code (a C/C++ identifier, a namespace) is validated and refused with one
line naming it; text that only rides along (a file name in a comment, a method name in a
string literal, a path in CMake) is escaped for its context, so no input can end a comment,
close a string or start a CMake command. Plain names pass through unchanged, so ordinary
output reads as before. :func:`install` registers the escapers as Jinja filters.

Filters: ``c_comment`` (``//`` and ``/* */`` text), ``c_string`` (a quoted C/C++ string
literal), ``cmake_comment``, ``cmake_arg`` (a quoted CMake argument), ``yaml_comment``,
``yaml_scalar``; validators: :func:`c_identifier`, :func:`cpp_namespace`, :func:`ident_from`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from etforge.core.common.errors import EtforgeError

#: C and C++ keywords and alternative tokens (C23 / C++23): never an identifier.
KEYWORDS = frozenset(
    """
    alignas alignof and and_eq asm atomic_cancel atomic_commit atomic_noexcept auto bitand bitor
    bool break case catch char char8_t char16_t char32_t class co_await co_return co_yield compl
    concept const const_cast consteval constexpr constinit continue decltype default delete do
    double dynamic_cast else enum explicit export extern false float for friend goto if inline int
    long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected
    public reflexpr register reinterpret_cast requires restrict return short signed sizeof static
    static_assert static_cast struct switch synchronized template this thread_local throw true try
    typedef typeid typename union unsigned using virtual void volatile wchar_t while xor xor_eq
    _Alignas _Alignof _Atomic _BitInt _Bool _Complex _Decimal128 _Decimal32 _Decimal64 _Generic
    _Imaginary _Noreturn _Static_assert _Thread_local
    """.split()
)
#: Namespaces the generated code names unqualified (kernel calls) or lives beside: a user
#: namespace with one of these names would capture those lookups, or reopen the standard's.
RESERVED_NAMESPACES = frozenset({"std", "executorch", "torch", "c10", "cortex_m", "etforge"})
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def c_identifier(value: str, what: str) -> str:
    """``value`` if it is an ASCII C/C++ identifier that is not a keyword nor reserved
    (``__x``, ``_X``); else an error naming ``what`` (and the keywords, when it is one)."""
    if not isinstance(value, str) or not _IDENT.fullmatch(value):
        raise EtforgeError(
            f"{what} {value!r} is not a C/C++ identifier (ASCII letters, digits and '_', not starting with a digit)"
        )
    if value in KEYWORDS:
        raise EtforgeError(
            f"{what} {value!r} is a C/C++ keyword; keywords are refused: {', '.join(sorted(KEYWORDS))}"
        )
    if value.startswith("__") or re.match(r"_[A-Z]", value):
        raise EtforgeError(
            f"{what} {value!r} is reserved for the implementation (starts with '__' or '_' + capital)"
        )
    return value


def cpp_namespace(value: str, what: str = "namespace") -> str:
    """A ``::``-separated C++ namespace of valid identifiers, none of :data:`RESERVED_NAMESPACES`."""
    parts = value.split("::") if isinstance(value, str) else [value]
    for part in parts:
        c_identifier(part, f"{what} {value!r}: component")
        if part in RESERVED_NAMESPACES:
            raise EtforgeError(
                f"{what} {value!r}: component {part!r} is a namespace the generated code uses; "
                f"refused: {', '.join(sorted(RESERVED_NAMESPACES))}"
            )
    return value


def c_prefix(value: str, what: str = "prefix") -> str:
    """A prefix of C identifiers and file names: empty, or an identifier (so ``prefix + name`` is one)."""
    return value if value == "" else c_identifier(value, what)


def ident_from(name: str, fallback: str = "m") -> str:
    """A valid identifier derived from a name the program carries (a method's): every other
    character becomes ``_``; a leading digit, a keyword or a reserved form gets a prefix."""
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name) or fallback
    if ident[0].isdigit() or ident in KEYWORDS or ident.startswith("_"):
        ident = f"{fallback}_{ident}"
    return ident


def _escaped(text: str, keep: Any) -> str:
    """Printable ASCII for which ``keep(c)`` holds passes; everything else is written as
    ``\\xNN`` (a byte of its UTF-8), so the result is one line of printable ASCII."""
    out = []
    for ch in str(text):
        if " " <= ch <= "~" and ch != "\\" and keep(ch):
            out.append(ch)
        else:
            out += [f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogatepass")]
    return "".join(out)


def c_comment(text: Any) -> str:
    """Text for a ``//`` or ``/* */`` comment: one line of printable ASCII that cannot close the
    comment (``*/``), continue it onto the next line (a final backslash) or form a trigraph."""
    body = _escaped(text, lambda c: True)
    return body.replace("*/", "*\\x2f").replace("/*", "/\\x2a").replace("??", "?\\x3f")


def c_string(text: Any) -> str:
    """A quoted C/C++ string literal holding ``text``'s UTF-8 bytes (octal escapes: unlike
    ``\\x``, they cannot swallow a following hex digit)."""
    out = []
    for b in str(text).encode("utf-8", "surrogatepass"):
        ch = chr(b)
        if ch in '"\\?' or not (0x20 <= b < 0x7F):
            out.append(f"\\{b:03o}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def cmake_comment(text: Any) -> str:
    """Text for a CMake ``#`` line comment: one line (no newline can start a command)."""
    return _escaped(text, lambda c: True)


def cmake_arg(text: Any) -> str:
    """A quoted CMake argument holding ``text``: ``\\``, ``"``, ``$``, ``;`` and control
    characters escaped, so no variable reference, list split or command is formed (a ``;``
    stays ``\\;``: one list element holding a semicolon, as CMake lists write it).

    A generator expression (``$<``) cannot be escaped in commands that evaluate them
    (``target_sources`` ...): it is refused."""
    text = str(text)
    if "$<" in text:
        raise EtforgeError(f"{text!r} holds '$<' (a CMake generator expression): refused in CMake arguments")
    special = {"\\": "\\\\", '"': '\\"', "$": "\\$", ";": "\\;", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    out = []
    for ch in text:
        if ch in special:
            out.append(special[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            raise EtforgeError(f"{text!r} holds a control character: refused in CMake arguments")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def yaml_comment(text: Any) -> str:
    """Text for a YAML ``#`` comment: one line of printable ASCII."""
    return _escaped(text, lambda c: True)


_YAML_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*(::[A-Za-z0-9_.]+)*")
_YAML_SPECIAL = frozenset({"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"})


def yaml_scalar(text: Any) -> str:
    """A YAML scalar holding ``text``: plain when it is a simple name (``aten::add.out``,
    ``model.pte``), else double-quoted with JSON's escapes (YAML reads them alike)."""
    text = str(text)
    if _YAML_PLAIN.fullmatch(text) and text.lower() not in _YAML_SPECIAL:
        return text
    return json.dumps(text, ensure_ascii=True)


FILTERS = {
    "c_comment": c_comment,
    "c_string": c_string,
    "cmake_comment": cmake_comment,
    "cmake_arg": cmake_arg,
    "yaml_comment": yaml_comment,
    "yaml_scalar": yaml_scalar,
}


def install(env: Any) -> Any:
    """Register the escapers as filters of the Jinja environment ``env`` (returned)."""
    env.filters.update(FILTERS)
    return env
