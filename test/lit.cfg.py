# -*- Python -*-
# lit configuration of pipec's test suite: .mlir files run through pipec-opt,
# .onnxtext/.test files through pipec, each checked with FileCheck.
import os

import lit.formats
from lit.llvm import llvm_config

config.name = "pipec"
config.test_format = lit.formats.ShTest(True)
config.suffixes = [".mlir", ".onnxtext", ".test"]
config.excludes = ["CMakeLists.txt", "unit", "lit.cfg.py", "lit.site.cfg.py", "Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.pipec_obj_root, "test")

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.pipec_tools_dir, append_path=True)

config.substitutions.append(("%examples", os.path.join(config.pipec_src_root, "examples")))
config.substitutions.append(("%oracle_python", config.pipec_python))
config.substitutions.append(("%pipec_src", config.pipec_src_root))
