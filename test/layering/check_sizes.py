#!/usr/bin/env python3
"""Size limits of the product sources (issue 49): no file over 1,000 lines,
no function over 200 (docs/build.md, "Size limits").

The sources under runtime/, analysis/, dialects/, passes/, compiler/ and
tools/ are read with comments and string literals blanked; a function is a
brace block opened right after a parameter list (`) {`, `) const {`,
`) override {`, ...), counted from its `{` to its `}`, lambdas inside it
included. The files and functions over a limit when the limits came in are
listed in OVER_LIMIT with their size then: they may shrink, never grow, and
one that drops under the limit must leave the list (so it stays true).

Exits 1 listing each problem as FILE[:FUNCTION]: size and limit.
"""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FOLDERS = ["runtime", "analysis", "dialects", "passes", "compiler", "tools"]
SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
FILE_LIMIT, FUNCTION_LIMIT = 1000, 200
# Functions still to split, at their size when the limits came in (issue 49
# split the last; an entry is never added).
OVER_LIMIT = {}
TOKEN = re.compile(r'//[^\n]*|/\*.*?\*/|R"(?P<delim>[^(\s]*)\(.*?\)(?P=delim)"|"(?:\\.|[^"\\\n])*"|'
                   r"'(?:\\.|[^'\\\n])*'", re.S)
BODY_AFTER = re.compile(r"\)\s*(?:const\s*)?(?:noexcept\s*)?(?:override\s*)?(?:final\s*)?(?:->\s*[\w:<>,\s\*&]+)?$")


def blanked(text):
    """The text with comments and literals replaced by spaces (newlines kept)."""
    return TOKEN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def function_name(text, close):
    """The qualified name before the parameter list that ends at `close`."""
    depth = 0
    for i in range(close, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            name = re.search(r"([\w:~]+(?:<[^<>()]*>)?)\s*$", text[:i])
            return name.group(1) if name else "?"
    return "?"


def functions(text):
    """(name, lines) of every function body of the blanked text."""
    found, stack = [], []
    for i, c in enumerate(text):
        if c == "{":
            before = text[max(0, i - 300):i]
            match = BODY_AFTER.search(before)
            inside = any(kind for kind, _, _ in stack)
            if match and not inside and not re.search(r"\b(if|for|while|switch|catch)\s*\($",
                                                      before[:match.start() + 1].rstrip()[-200:]):
                close = i - len(before) + match.start()
                stack.append((True, i, function_name(text, close)))
            else:
                stack.append((False, i, None))
        elif c == "}" and stack:
            is_function, start, name = stack.pop()
            if is_function:
                found.append((name, text.count("\n", start, i) + 1))
    return found


def main():
    problems, seen = [], set()
    for folder in FOLDERS:
        for directory, _, names in os.walk(os.path.join(ROOT, folder)):
            for name in sorted(names):
                if not name.endswith(SUFFIXES):
                    continue
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, ROOT)
                with open(path, errors="replace") as stream:
                    text = stream.read()
                longest = {}  # overloads and same-named functions: the longest
                for fn, lines in functions(blanked(text)):
                    longest[fn] = max(lines, longest.get(fn, 0))
                sizes = [(relative, text.count("\n") + (not text.endswith("\n")), FILE_LIMIT)]
                sizes += [(f"{relative}:{fn}", lines, FUNCTION_LIMIT) for fn, lines in longest.items()]
                for key, size, limit in sizes:
                    allowed = OVER_LIMIT.get(key)
                    if allowed is not None:
                        seen.add(key)
                        if size > allowed:
                            problems.append(f"{key}: {size} lines, grown past the {allowed} it had "
                                            f"(limit {limit}; split it rather than grow it)")
                        elif size <= limit:
                            problems.append(f"{key}: {size} lines, now within the limit of {limit}: "
                                            "remove it from OVER_LIMIT in test/layering/check_sizes.py")
                    elif size > limit:
                        problems.append(f"{key}: {size} lines, over the limit of {limit}")
    for key in sorted(set(OVER_LIMIT) - seen):
        problems.append(f"{key}: listed in OVER_LIMIT but not found (renamed or split? update the list)")
    if problems:
        sys.exit("size limits (docs/build.md, \"Size limits\"):\n  " + "\n  ".join(problems))
    print(f"every product file within {FILE_LIMIT} lines and every function within {FUNCTION_LIMIT}" +
          (f", but the {len(OVER_LIMIT)} listed to split" if OVER_LIMIT else ""))


if __name__ == "__main__":
    main()
