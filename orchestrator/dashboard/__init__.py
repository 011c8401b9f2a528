"""The live web dashboard (`orchestrate dashboard`, `up --dashboard`).

`snapshot` is what the supervisor writes at each poll; `model`, `charts` and `watch` build the
page's documents without any web framework; only `app` and `server` import Starlette and uvicorn.
"""
