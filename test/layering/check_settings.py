#!/usr/bin/env python3
"""Each setting is declared once, and choices are compared as enums.

docs/settings.md: every setting of pipec is declared in
analysis/Settings/Declared.h; command lines, pass options and pipelines bind
to those declarations. This test reads the product sources of tools/,
analysis/, passes/ and compiler/ and counts, for every setting name:

- its declarations in Declared.h (`Setting kX{"name", ...}` and the
  typed variants), and
- every other option declaration of that name: an llvm::cl option
  (`cl::opt<T> x("name"`, `cl::list`), an MLIR pass option in C++
  (`Option<T> x{*this, "name"`) or in TableGen (`Option<"x", "name"`,
  `ListOption<...>`), and a hand-written flag dispatch (`== "--name"`).

The settings the issue names (microbatches, stages, schedule, chunks, target,
precision) must be declared exactly once in all; no setting of Declared.h
may be declared anywhere else.

Below tools/ (analysis/, passes/, compiler/), no string literal spells a
declared setting's flag (`"--stages 5: ..."`): messages build it from the
declaration (`settings::flag(settings::kStages)`), so that renaming an
option renames every message, and the CLI vocabulary lives in one place.
Declared.h (its help texts) and the binders that attach settings to
command lines are the exceptions.

It also refuses a string comparison against a spelling of a choice (a target,
a precision, an optimizer, a schedule family, ...) outside its registry
(runtime/include/pipec/vocabulary.h), in every layer including the runtime:
such code reads the enum instead. The spellings are read from the registry's
`Choices<E>` tables themselves, every table and every row, so that a new
choice or spelling is checked without editing this test.

Exits 1 listing every violation.
"""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DECLARED = os.path.join("analysis", "Settings", "Declared.h")
OPTION_DIRS = ["tools", "analysis", "passes", "compiler"]
CHOICE_DIRS = ["tools", "analysis", "passes", "compiler", "dialects", "runtime"]
REGISTRY = os.path.join("runtime", "include", "pipec", "vocabulary.h")
SUFFIXES = (".h", ".cpp", ".cu", ".td", ".inc")
BELOW_TOOLS = ["analysis", "passes", "compiler"]
BINDERS = {DECLARED, os.path.join("analysis", "Settings", "Settings.h"), os.path.join("analysis", "Settings", "TextBinder.h"),
           os.path.join("passes", "OptionsBinder.h")}
MUST_BE_ONCE = ["microbatches", "stages", "schedule", "chunks", "target", "precision"]

SETTING = re.compile(r'(?:Setting|IntSetting|RealSetting|ChoiceSetting<\w+>)\s+k\w+\{\s*\{?\s*"([\w-]+)"')
OTHER_DECLARATIONS = [
    re.compile(r'cl::(?:opt|list)<[^;]*?>\s*\w*\s*[({]\s*"([\w-]+)"'),
    re.compile(r'\bOption<[^;"]*?>\s*\w+\s*\{\s*\*this\s*,\s*"([\w-]+)"'),
    re.compile(r'\b(?:List)?Option<\s*"\w+"\s*,\s*"([\w-]+)"'),
    re.compile(r'==\s*"--([\w-]+)"'),
]
# A choice's table in the registry: `template <> struct Choices<E> {
# static constexpr const char *spellings[] = {"a", "b", ...}; };`.
CHOICES_TABLE = re.compile(r'struct\s+Choices<(\w+)>\s*\{\s*static\s+constexpr\s+const\s+char\s*\*\s*'
                           r'spellings\[\]\s*=\s*\{(.*?)\};', re.S)
# Spellings that other vocabularies share, compared as strings there: ONNX's
# attributes (a loss's reduction, Gelu's approximate) spell "none" as
# RecomputeMode does.
NOT_ONLY_CHOICES = {"none"}


def choice_spellings():
    """{spelling: [enum, ...]} of every Choices<E> table in the registry."""
    text = open(os.path.join(ROOT, REGISTRY), encoding="utf-8").read()
    spellings = {}
    for enum, body in CHOICES_TABLE.findall(text):
        for spelling in re.findall(r'"((?:[^"\\]|\\.)*)"', re.sub(r"//[^\n]*", "", body)):
            spellings.setdefault(spelling, []).append(enum)
    return spellings


def sources(dirs):
    for top in dirs:
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                if name.endswith(SUFFIXES):
                    path = os.path.join(folder, name)
                    yield os.path.relpath(path, ROOT), open(path, encoding="utf-8", errors="replace").read()


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def main():
    problems = []
    declared = {}  # name -> [where]
    others = {}    # name -> [where]
    for path, text in sources(OPTION_DIRS):
        if path == DECLARED:
            for m in SETTING.finditer(text):
                declared.setdefault(m.group(1), []).append("%s:%d" % (path, line_of(text, m.start())))
            continue
        for pattern in OTHER_DECLARATIONS:
            for m in pattern.finditer(text):
                others.setdefault(m.group(1), []).append("%s:%d" % (path, line_of(text, m.start())))
    if not declared:
        problems.append("%s declares no setting (has its syntax changed? update this test)" % DECLARED)
    for name in MUST_BE_ONCE:
        where = declared.get(name, []) + others.get(name, [])
        if len(where) != 1:
            problems.append("'%s' is declared %d times, must be once: %s" % (name, len(where), ", ".join(where)))
    for name, where in sorted(declared.items()):
        if name in others:
            problems.append("'%s' is declared in %s and again at %s" % (name, DECLARED, ", ".join(others[name])))
    flag_literal = re.compile(r'"[^"\n]*?(?<![\w-])--(%s)(?![\w-])' % "|".join(
        re.escape(n) for n in sorted(declared, key=len, reverse=True)))
    for path, text in sources(BELOW_TOOLS):
        if path in BINDERS:
            continue
        for line_number, line in enumerate(text.split("\n"), 1):
            if line.lstrip().startswith("//"):
                continue
            for m in flag_literal.finditer(line.split(" // ")[0]):
                problems.append("%s:%d: the string spells --%s; build it from its declaration "
                                "(settings::flag(settings::k...))" % (path, line_number, m.group(1)))
    spellings = choice_spellings()
    if not spellings:
        problems.append("%s has no Choices<E> table (has its syntax changed? update this test)" % REGISTRY)
    checked = sorted(set(spellings) - NOT_ONLY_CHOICES, key=len, reverse=True)
    alternation = "|".join(re.escape(s) for s in checked)
    comparison = re.compile(r'[!=]=\s*"(%s)"|"(%s)"\s*[!=]=' % (alternation, alternation))
    for path, text in sources(CHOICE_DIRS) if checked else []:
        if path == REGISTRY:
            continue
        for m in comparison.finditer(text):
            spelling = m.group(1) or m.group(2)
            problems.append("%s:%d: compares a string with the spelling \"%s\" of %s; compare the enum "
                            "(pipec/vocabulary.h, Choices)" % (path, line_of(text, m.start()), spelling,
                                                              " or ".join(spellings[spelling])))
    for p in problems:
        print(p)
    if problems:
        return 1
    print("%d settings declared once in %s; no choice compared as a string (%d spellings of %d choices in %s)"
          % (len(declared), DECLARED, len(checked), len({e for es in spellings.values() for e in es}), REGISTRY))
    return 0


if __name__ == "__main__":
    sys.exit(main())
