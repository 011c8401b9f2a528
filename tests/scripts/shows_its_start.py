"""Prints how it was started (argv, __name__, __file__, sys.path[0], cwd) as JSON, then exits
with the code given as its first argument (or raises, with "raise")."""

import json
import os
import sys

print(json.dumps({"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
                  "cwd": os.getcwd(), "main_file": sys.modules["__main__"].__file__}))  # fmt: skip
sys.stdout.flush()
if sys.argv[1] == "raise":
    raise RuntimeError("raised on purpose")
if sys.argv[1] == "wait":
    import time

    print("waiting", flush=True)
    time.sleep(60)
sys.exit(int(sys.argv[1]))
