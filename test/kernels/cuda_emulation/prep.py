#!/usr/bin/env python3
"""Translates pipec's CUDA kernel sources for host emulation (emu.h).

usage: prep.py SRC_DIR DST_DIR
Every SRC_DIR/*.cu becomes DST_DIR/*.cpp with each launch
`kernel<<<grid, block, smem, stream>>>(args)` rewritten to
`emu::launch(emu::Cfg(grid, block, smem, stream), kernel)(args)`;
*.cuh headers are copied unchanged. Files are only rewritten when their
text changes, so an unrelated edit does not recompile every source.
"""
import pathlib
import re
import sys

LAUNCH = re.compile(r'(\b[\w:]+(?:<[^<>;()]*>)?)<<<(.*?)>>>\(', flags=re.S)


def translate(text):
    return LAUNCH.sub(lambda m: 'emu::launch(emu::Cfg(%s), %s)(' % (m.group(2), m.group(1)), text)


def main():
    src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.suffix == '.cu':
            out, text = dst / (f.stem + '.cpp'), translate(f.read_text())
            if '<<<' in text:
                sys.exit('prep.py: %s: a launch was not translated' % f)
        elif f.suffix == '.cuh':
            out, text = dst / f.name, f.read_text()
        else:
            continue
        if not out.exists() or out.read_text() != text:
            out.write_text(text)


if __name__ == '__main__':
    main()
