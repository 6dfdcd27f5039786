"""Generated code and build commands never carry input text unescaped (issue
11, item 1). The full test is test/security/injection.py (ctest
security-injection: hostile names compiled, built and trained); these cases
cover what reaches the build command line and the NUL safety net:

- a name with a NUL byte (node or initializer) is refused, naming it;
- an --out directory holding shell syntax (`'`, `;`, `$(...)`, a leading
  `-`) builds and leaves no trace of a command run.
"""
import importlib.util
import os

from corpus import Case

HERE = os.path.dirname(os.path.abspath(__file__))


def _injection():
    spec = importlib.util.spec_from_file_location("injection", os.path.join(HERE, "injection.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Runs pipec --build with a hostile --out and fails if the marker appears or
# no library was built. argv: python -c SCRIPT pipec model out marker cwd
OUT_DIR_SCRIPT = r"""
import os, subprocess, sys
pipec, model, out, marker, cwd = sys.argv[1:6]
r = subprocess.run([pipec, model, "--gpus", "1x2", "--microbatches", "2", "--out=" + out, "--build"],
                   cwd=cwd, capture_output=True, text=True)
print(r.stdout[-2000:], r.stderr[-2000:])
if os.path.exists(marker):
    sys.exit("the marker exists: a shell command from --out ran")
if r.returncode != 0:
    sys.exit(f"pipec failed with exit {r.returncode}")
library = os.path.join(cwd, out, "stages", "libstage_0.so")
if not os.path.exists(library):
    sys.exit(f"no {library}")
print("built, no marker")
"""


def cases(ctx):
    injection = _injection()
    out = []

    for where in ("node", "initializer"):
        path = ctx.path("emit", f"nul-{where}.onnx")

        def setup(path=path, where=where):
            with open(path, "wb") as stream:
                stream.write(injection.nul_model(where))
        out.append(Case(f"nul-{where}-name", [ctx.pipec, path, "--gpus", "1x2", "--out",
                                              ctx.path("emit", f"nul-{where}-job"), "--build"],
                        expect=[r"nul-" + where + r"\.onnx|evil", r"NUL"], setup=setup, timeout=60))

    marker = ctx.path("emit", "out-dir", "MARKER")
    cwd = os.path.dirname(marker)
    for label, directory in [
            ("quote", "job'; touch MARKER; echo '"),
            ("substitution", "job$(touch MARKER)`touch MARKER`"),
            ("dash", "-fplugin=MARKER"),
    ]:
        out.append(Case(f"out-dir-{label}",
                        [ctx.python, "-c", OUT_DIR_SCRIPT, os.path.abspath(ctx.pipec),
                         os.path.join(ctx.examples, "mlp.onnx"), directory, marker, cwd],
                        ok=True, timeout=180))
    return out
