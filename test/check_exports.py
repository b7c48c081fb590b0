#!/usr/bin/env python3
"""The shared library exports the public API, all of it and nothing else.

    check_exports.py LIBNABLA_SO INCLUDE_DIR

Every function the headers in INCLUDE_DIR/nabla declare (an nb_ name
followed by its parenthesis, comments left out) must be a defined dynamic
symbol of LIBNABLA_SO, and every defined dynamic symbol must be such an nb_
name: no internal nb__ function, no CUDA or CUB symbol (lib/nabla.map says
what is exported). A public function left out of the map fails a program at
link time; an internal one let out binds the library's own calls through the
PLT. Skips (77) where nm is missing or the library is no ELF file.
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path


def declared(include_dir):
    names = set()
    for header in sorted(Path(include_dir, "nabla").glob("*.h")):
        text = header.read_text()
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        for name in re.findall(r"\b(nb_[A-Za-z0-9_]+)\(", text):
            if not name.startswith("nb__"):
                names.add(name)
    return names


def exported(lib):
    nm = shutil.which("nm")
    if not nm:
        print("nm not found: skipped")
        sys.exit(77)
    run = subprocess.run([nm, "-D", "--defined-only", lib], capture_output=True, text=True)
    if run.returncode != 0:
        print(f"nm cannot read {lib}: skipped ({run.stderr.strip()})")
        sys.exit(77)
    symbols = set()
    for line in run.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            symbols.add(parts[2].split("@")[0])
    return symbols


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    want = declared(sys.argv[2])
    have = exported(sys.argv[1])
    if len(want) < 100:
        print(f"only {len(want)} public functions found in {sys.argv[2]}/nabla: the header scan is broken")
        return 1
    missing = sorted(want - have)
    extra = sorted(s for s in have - want if not (s.startswith("nb_") and not s.startswith("nb__")))
    undeclared = sorted(s for s in have - want if s.startswith("nb_") and not s.startswith("nb__"))
    for name in missing:
        print(f"declared in a public header but not exported: {name}")
    for name in extra[:40]:
        print(f"exported but not public: {name}")
    if len(extra) > 40:
        print(f"... and {len(extra) - 40} more not public")
    for name in undeclared:
        print(f"exported nb_ name that no public header declares: {name}")
    print(f"{len(want)} public functions declared, {len(have)} symbols exported")
    return 1 if missing or extra or undeclared else 0


if __name__ == "__main__":
    sys.exit(main())
