"""GBNF for the integers, and the numbers with a whole part, between two whole bounds (either
may be open): what a JSON schema's ``minimum``/``maximum`` allow, written digit by digit so
that a grammar-constrained reply cannot carry a number outside them (``json_schema.py``).
"""

from __future__ import annotations

_FRACTION = '("." [0-9]+)?'
_ZEROS = '("." "0"+)?'


def int_range(low: int | None, high: int | None) -> str:
    """Integers in [low, high] (None: unbounded on that side), as GBNF alternatives."""
    options = []
    if low is None or low < 0:  # negative ones: "-" and a magnitude in [max(1, -high), -low]
        magnitudes = _uint_range(
            max(1, -high) if high is not None else 1, None if low is None else -low
        )
        options.append(f'"-" ({magnitudes})')
    if high is None or high >= 0:
        options.append(_uint_range(max(0, low) if low is not None else 0, high))
    return " | ".join(options)


def number_range(low: int | None, high: int | None) -> str:
    """Decimal numbers (no exponent) in [low, high], for whole-number bounds."""
    options = []
    if low is None or low < 0:
        top = max(0, -high) if high is not None else 0  # the smallest magnitude allowed
        if low is None:
            options.append(f'"-" ({_uint_range(top, None)}) {_FRACTION}')
        else:
            if top < -low:
                options.append(f'"-" ({_uint_range(top, -low - 1)}) {_FRACTION}')
            options.append(f'"-" "{-low}" {_ZEROS}')
    if high is None or high >= 0:
        start = max(0, low) if low is not None else 0
        if high is None:
            options.append(f"({_uint_range(start, None)}) {_FRACTION}")
        else:
            if start < high:
                options.append(f"({_uint_range(start, high - 1)}) {_FRACTION}")
            options.append(f'"{high}" {_ZEROS}')
    return " | ".join(options)


def _uint_range(low: int, high: int | None) -> str:
    """Non-negative integers in [low, high] without leading zeros."""
    assert low >= 0 and (high is None or high >= low)
    if high is None:  # as wide as low, or wider: up to the 16 digits of the integer rule
        width = len(str(low))
        same = _same_width(str(low), "9" * width)
        # (a low of 16 digits or more: one digit more; never {m,n} with n < m, which
        # llama.cpp's grammar parser expands until memory runs out)
        return f"{same} | [1-9] [0-9]{{{width},{max(width, 15)}}}"
    options = []
    for width in range(len(str(low)), len(str(high)) + 1):
        lo = str(low) if width == len(str(low)) else "1" + "0" * (width - 1)
        hi = str(high) if width == len(str(high)) else "9" * width
        if width == 1 and low == 0:
            lo = "0"
        options.append(_same_width(lo, hi))
    return " | ".join(options)


def _same_width(low: str, high: str) -> str:
    """Digit strings of one width between ``low`` and ``high`` (inclusive), as GBNF."""
    if not low:
        return '""'
    if low == high:
        return f'"{low}"'
    first_low, first_high = int(low[0]), int(high[0])
    rest = len(low) - 1
    if low[1:] == "0" * rest and high[1:] == "9" * rest:
        return f"[{first_low}-{first_high}]" + (f" [0-9]{{{rest}}}" if rest else "")
    if first_low == first_high:
        return f'"{low[0]}" ({_same_width(low[1:], high[1:])})'
    options = [f'"{low[0]}" ({_same_width(low[1:], "9" * rest)})']
    if first_high - first_low > 1:
        options.append(
            f"[{first_low + 1}-{first_high - 1}]" + (f" [0-9]{{{rest}}}" if rest else "")
        )
    options.append(f'"{high[0]}" ({_same_width("0" * rest, high[1:])})')
    return " | ".join(options)
