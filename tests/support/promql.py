"""Just enough PromQL structure to take an alert expression apart: the operands its conditions compare.

An alert expression is conditions joined by `and`/`or`/`unless`, each a query compared with a threshold. An alert
that stays quiet says nothing about whether its queries find the series they mean; its operands do: each must
return data on a fleet that has them. `operands` splits at the top-level set operators, drops the comparison and
its threshold, and opens `absent(X)` to X (absent is quiet exactly when X returns data).

It understands the shapes `exporter.generate.rules` writes, not all of PromQL: nesting depth, quoted strings and
label matchers (`=~` inside braces is no comparison) are respected; `bool` comparisons are not expected.
"""

import re

_SET_OPERATOR = re.compile(r"(and|or|unless)\b")
_COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)")
_ABSENT = re.compile(r"absent\s*\(")
_OPEN, _CLOSE = "([{", ")]}"


def _depth_zero(expr: str) -> list[bool]:
    """For each character: is it outside every bracket and string?"""
    flags, depth, quote, escaped = [], 0, "", False
    for char in expr:
        if quote:
            flags.append(False)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
            continue
        if char in "\"'`":
            quote = char
            flags.append(False)
        elif char in _OPEN:
            flags.append(False)
            depth += 1
        elif char in _CLOSE:
            depth -= 1
            flags.append(False)
        else:
            flags.append(depth == 0)
    return flags


def _strip_parens(expr: str) -> str:
    """`(x)` -> `x`, when the first "(" closes at the very end (so not `(a) + (b)`)."""
    expr = expr.strip()
    while expr.startswith("(") and expr.endswith(")") and _balanced(expr[1:-1]):
        expr = expr[1:-1].strip()
    return expr


def _balanced(expr: str) -> bool:
    depth, quote = 0, ""
    for char in expr:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'`":
            quote = char
        elif char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _split_set_operators(expr: str) -> list[str]:
    flags = _depth_zero(expr)
    parts, start, i = [], 0, 0
    while i < len(expr):
        match = _SET_OPERATOR.match(expr, i) if flags[i] else None
        if match and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:")):
            parts.append(expr[start:i])
            start = i = match.end()
            continue
        i += 1
    parts.append(expr[start:])
    return [part.strip() for part in parts]


def _left_of_comparison(expr: str) -> str:
    flags = _depth_zero(expr)
    for i in range(len(expr)):
        if flags[i] and _COMPARISON.match(expr, i):
            return expr[:i].strip()
    return expr


def operands(expr: str) -> list[str]:
    """The queries an alert expression's conditions compare, in order."""
    expr = _strip_parens(expr)
    parts = _split_set_operators(expr)
    if len(parts) > 1:
        return [found for part in parts for found in operands(part)]
    absent = _ABSENT.match(expr)
    if absent and _balanced(expr[absent.end() : -1]) and expr.endswith(")"):
        return [expr[absent.end() : -1].strip()]
    left = _left_of_comparison(expr)
    return operands(left) if left != expr else [expr]
