"""The agent's file verbs: the checkpoints of a directory (and making a copied one the latest),
every file under a directory, and the directories a run needs before files are copied in.

STANDARD LIBRARY ONLY (part of the agent, shipped with it: hostside/bundle.py).
"""

import contextlib
import os
import stat

if __package__:  # imported as part of orchestrate: the controller's tests
    from orchestrator import contract
    from orchestrator.hostside import protocol, rundir, safefiles
else:  # shipped: hostside/bundle.py carries them in front of the agent's source
    import contract  # type: ignore[no-redef]
    import protocol  # type: ignore[no-redef]
    import rundir  # type: ignore[no-redef]
    import safefiles  # type: ignore[no-redef]

STATE_FILE = contract.CHECKPOINT_STATE_FILE


def _checkpoint_names(directory):
    """The checkpoints TensorFlow's state file lists, oldest first, the latest last."""
    try:
        with open(os.path.join(directory, STATE_FILE), encoding="utf-8") as handle:
            return contract.checkpoint_state_names(handle.read())
    except OSError:
        return []


def cmd_checkpoint(request):
    """The latest checkpoint and the earlier ones the state file keeps, with their files: a
    host that resumes needs all of them, so that it can fall back to the same earlier one as
    the chief when the latest cannot be loaded."""
    directory = rundir.expand(request["directory"])
    names = _checkpoint_names(directory)
    files, present = {}, []
    try:
        entries = os.listdir(directory)
    except OSError:
        entries = []
    for name in names:
        mine = [e for e in entries if e.startswith(name + ".")]
        if mine:
            present.append(name)
        for entry in mine:
            files[entry] = os.path.getsize(os.path.join(directory, entry))
    for extra in request.get("companions", []):  # files that travel with the checkpoints
        if present and extra in entries:
            files[extra] = os.path.getsize(os.path.join(directory, extra))
    latest = names[-1] if names and names[-1] in present else None
    return {protocol.DIRECTORY_KEY: directory, protocol.LATEST_KEY: latest,
            protocol.CHECKPOINTS_KEY: present, protocol.FILES_KEY: files}  # fmt: skip


def cmd_adopt_checkpoint(request):
    """Make `name` (its files already copied in) the latest checkpoint of the directory, with
    `checkpoints` the ones listed before it."""
    directory, name = rundir.expand(request["directory"]), request[protocol.NAME_KEY]
    names = [n for n in request.get("checkpoints", [name]) if n != name] + [name]
    state = os.path.join(directory, STATE_FILE)
    umask = os.umask(0)
    os.umask(umask)  # the state file keeps the user's umask, like the checkpoints beside it
    fd, tmp = safefiles.temp_beside(state, 0o666 & ~umask)
    with open(fd, "w", encoding="utf-8") as handle:
        # Relative paths: TensorFlow resolves them against this directory on this host.
        handle.write(contract.checkpoint_state_text(names))
    os.replace(tmp, state)  # last, so a half-copied checkpoint is never the latest
    return {protocol.DIRECTORY_KEY: directory, protocol.LATEST_KEY: name}


def cmd_set_aside(request):
    """Move the directory's contents to a sibling, DIRECTORY.set-aside-STAMP (-STAMP-2, ... when
    that is taken): `up --fresh` starts over and loses nothing. The directory (a link's target)
    is renamed whole, which cannot half-happen, and made again, empty and with its mode, so that
    a link to it still leads somewhere. A directory that is missing or empty is left alone."""
    directory = os.path.realpath(rundir.expand(request[protocol.DIRECTORY_KEY]))
    stamp = str(request[protocol.STAMP_KEY])
    if not stamp or "/" in stamp or stamp.strip(".") == "":
        raise ValueError(f"not a stamp for a directory's name: {stamp!r}")
    count = sum(len(names) for _parent, _dirs, names in os.walk(directory))
    try:
        empty = not os.listdir(directory)
    except OSError:  # missing, or not a directory: nothing of a checkpoint's to move
        empty = True
    if empty:
        return {protocol.DIRECTORY_KEY: directory, protocol.MOVED_TO_KEY: None,
                protocol.COUNT_KEY: 0}  # fmt: skip
    base = f"{directory}.set-aside-{stamp}"
    target, number = base, 1
    while os.path.lexists(target):
        number += 1
        target = f"{base}-{number}"
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    try:
        os.rename(directory, target)
    except OSError as error:  # a mount point, a directory of another owner
        raise OSError(f"cannot move {directory} to {target}: {error.strerror}") from None
    os.mkdir(directory)
    os.chmod(directory, mode)
    return {protocol.DIRECTORY_KEY: directory, protocol.MOVED_TO_KEY: target,
            protocol.COUNT_KEY: count}  # fmt: skip


def cmd_files(request):
    """Every file under the directory, with its size and modification time."""
    root = rundir.expand(request["directory"])
    found = {}
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                stat = os.stat(path)
                found[os.path.relpath(path, root)] = [stat.st_size, stat.st_mtime]
    return {protocol.ROOT_KEY: root, protocol.FILES_KEY: found}


def cmd_make_dirs(request):
    """Create the directories (parents too) and the private ones (0700) before files are
    copied in: no shell command per host."""
    # first: checked before any is used
    rundir.make_private_dirs(request.get(protocol.PRIVATE_DIRS_KEY, []))
    for path in request.get(protocol.DIRECTORIES_KEY, []):
        os.makedirs(rundir.expand(path), exist_ok=True)
    return {"made": True}
