"""Writes the table of docs/errors.md from the case tables of tests/torch/test_bad_inputs.py: one row per case with the
call, the exception (or warning) class and the message it gives now (abridged). Runs every CPU case; the GPU cases
are listed with the message words their test requires.

    python3 tools/errors_table.py           # print the table
    python3 tools/errors_table.py --write   # replace the table between the markers in docs/errors.md
"""
import inspect
import os
import re
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from tests.torch import test_bad_inputs as tb  # noqa: E402
from tests.torch.helpers import tex_module  # noqa: E402

BEGIN, END = "<!-- errors-table: begin -->", "<!-- errors-table: end -->"
MAX_MSG = 230


def call_text(fn) -> str:
    """The body of `lambda t: ...` as written in the test file, `t.` shown as `tex.`."""
    src = inspect.getsource(fn)
    start = src.index("lambda t:") + len("lambda t:")
    depth, i, quote = 0, start, None
    while i < len(src):
        c = src[i]
        if quote:
            if c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        i += 1
    body = " ".join(src[start:i].split())
    body = re.sub(r"\(t, ", "(", body).replace("(t)", "()")
    return re.sub(r"\bt\.", "tex.", body)


def message(case) -> str:
    """What the call raises (or, for a warning case, warns), on one line, abridged."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        try:
            case.call(tex_module())
        except Exception as e:  # noqa: BLE001
            text = str(e)
        else:
            assert got, f"{case.id} neither raised nor warned"
            text = str(got[0].message)
    msg = " ".join(text.split())
    return msg if len(msg) <= MAX_MSG else msg[:MAX_MSG - 1] + "…"


def cell(s: str) -> str:
    return s.replace("|", "\\|")


def table() -> str:
    rows = ["| case | call | exception | rule | message (abridged) |", "|---|---|---|---|---|"]
    for c in tb.CASES + tb.WARNING_CASES:
        rows.append(f"| `{c.id}` | `{cell(call_text(c.call))}` | {c.exc.__name__} | {c.rule} | "
                    f"{cell(message(c))} |")
    for c in tb.CUDA_CASES:
        words = "; ".join(f"“{w}”" for w in c.words)
        rows.append(f"| `{c.id}` (cuda) | `{cell(call_text(c.call))}` | {c.exc.__name__} | {c.rule} | "
                    f"names {cell(words)} |")
    return "\n".join(rows)


def main():
    text = table()
    if "--write" not in sys.argv:
        print(text)
        return
    path = os.path.join(ROOT, "docs", "errors.md")
    page = open(path).read()
    head, rest = page.split(BEGIN)
    _, tail = rest.split(END)
    with open(path, "w") as f:
        f.write(f"{head}{BEGIN}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()
