#!/usr/bin/env python3
"""The layers of docs/layers.md, checked on the include lines.

Lowest first: runtime (plain C++, no MLIR), analysis (plain C++, no MLIR),
dialects, passes, compiler, tools. A product source file may include headers
of its own layer and the layers below, never one above; runtime and
analysis include no LLVM or MLIR header at all. The runtime's standalone
build (runtime/CMakeLists.txt and the runtime tests it adds) names nothing
under compiler/.

Exits 1 listing every violation as FILE:LINE: what it includes and why that
is refused.
"""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LAYERS = ["runtime", "analysis", "dialects", "passes", "compiler", "tools"]
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".td", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"|^\s*include\s+"([^"]+)"')
# Plain C++ layers: the runtime deploys without LLVM, the analysis libraries
# are tested and benchmarked without it.
NO_LLVM = {"runtime", "analysis"}


def layer_of_include(path):
    top = path.split("/", 1)[0]
    return top if top in LAYERS else None


def violations():
    found = []
    for layer in LAYERS:
        for folder, _, files in os.walk(os.path.join(ROOT, layer)):
            for name in files:
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, ROOT)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        included = m.group(1) or m.group(2)
                        top = included.split("/", 1)[0]
                        if layer in NO_LLVM and top in ("mlir", "llvm"):
                            found.append(f"{rel}:{number}: includes {included}: {layer}/ is plain "
                                         f"C++ and uses no LLVM or MLIR header")
                            continue
                        target = layer_of_include(included)
                        if target and LAYERS.index(target) > LAYERS.index(layer):
                            found.append(f"{rel}:{number}: includes {included}: {target}/ is a "
                                         f"layer above {layer}/")
    # The runtime builds alone: nothing of its build names compiler/.
    for rel in ["runtime/CMakeLists.txt", "runtime/cmake", "runtime/kernels/CMakeLists.txt",
                "test/runtime/CMakeLists.txt"]:
        path = os.path.join(ROOT, rel)
        paths = ([os.path.join(path, n) for n in sorted(os.listdir(path))]
                 if os.path.isdir(path) else [path])
        for p in paths:
            if not os.path.isfile(p):
                continue
            with open(p, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    code = line.split("#", 1)[0]
                    if re.search(r"(^|[/\s])compiler/", code):
                        found.append(f"{os.path.relpath(p, ROOT)}:{number}: the runtime's "
                                     f"standalone build names compiler/")
    return found


def main():
    found = violations()
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} include(s) break the layering of docs/layers.md")
        return 1
    print("layering: every include goes to the same layer or one below (docs/layers.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
