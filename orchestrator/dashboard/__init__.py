"""The live web dashboard (`orchestrate dashboard`, `up --dashboard`).

The supervisor writes a status snapshot at each poll (engine/observe/snapshot.py); `model`, `charts`
and `watch` build the page's documents without any web framework; only `app`, `auth` and
`server` import Starlette and uvicorn.
"""
