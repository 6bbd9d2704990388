"""Fail setup early when the installed llama-cpp-python was built with ggml's AMX backend.

That backend faults on some virtual machines (see the Makefile's NOTE on LLAMA_CMAKE_ARGS). A wheel
built before the flag was added can come back from pip's wheel cache, which does not key on CMAKE_ARGS;
this check names the fix instead of letting the first decode end in a segmentation fault.
"""

from __future__ import annotations

import sys

import llama_cpp


def main() -> int:
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    if "AMX_INT8 = 1" in info:
        print(
            "llama-cpp-python was built with ggml's AMX backend (a cached wheel from before LLAMA_CMAKE_ARGS?).\n"
            "Rebuild it: .venv/bin/python -m pip uninstall -y llama_cpp_python && "
            ".venv/bin/python -m pip cache remove llama_cpp_python && make setup",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
