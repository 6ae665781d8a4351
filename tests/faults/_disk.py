"""A simulated disk for power-cut tests.

Installed as ``logstore.fileio.recorder``, a :class:`SimDisk` logs every
durability-relevant operation the engine performs under a data directory
(creates, writes, syncs, truncates, directory syncs, mkdirs, renames,
hard links, unlinks, tree removals), against a model of that directory taken when it was
installed (everything in it then counts as durable). Replaying the log up to
any operation, it produces what a disk could hold if power were lost right
there, under two models:

* **strict** (POSIX, as LevelDB's fault-injection test and SQLite's crash VFS
  assume): a file's data is durable only up to its last ``fsync``/``fdatasync``;
  every write or truncate since is dropped, applied, torn (a random subset of
  its 512-byte sectors, the rest left as they were or zero past the old end)
  or turned to zeros (the size reached the disk, the data did not), each
  independently, in order. A directory entry (create, mkdir, rename, unlink)
  is durable only once that directory was synced: the ``drop`` and ``keep``
  variants roll back every change since (a file created and synced but never
  linked by a directory sync is gone, a rename not covered is undone); the
  ``random`` variant keeps a random subset of those changes, each whole
  (a rename is atomic), in the order they were made.
* **lenient** (like ext4 with ``data=ordered``): operations reach the disk in
  the order they were issued, data before the metadata that follows it: the
  state is the prefix of the log up to the cut, and the write in flight at
  the cut is torn at sector granularity.

Only what happens under the root is modelled; descriptors are mapped to
files by inode number, so the engine's own code paths are used unchanged.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

SECTOR = 512

Op = tuple[Any, ...]


@dataclass
class _File:
    ident: int
    durable: bytearray = field(default_factory=bytearray)
    current: bytearray = field(default_factory=bytearray)
    #: ("w", offset, data) or ("t", size) since the last sync, in order.
    pending: list[Op] = field(default_factory=list)


@dataclass
class _Dir:
    current: dict[str, _File | _Dir] = field(default_factory=dict)
    durable: dict[str, _File | _Dir] = field(default_factory=dict)


@dataclass(frozen=True)
class Image:
    """A directory tree's content: directories and files by relative path."""

    dirs: frozenset[str]
    files: tuple[tuple[str, bytes], ...]

    def digest(self) -> str:
        h = hashlib.sha256()
        for d in sorted(self.dirs):
            h.update(b"d" + d.encode() + b"\0")
        for name, data in self.files:
            h.update(b"f" + name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
        return h.hexdigest()

    def write(self, root: str) -> None:
        """Make ``root`` hold exactly this image."""
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        for d in sorted(self.dirs, key=len):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        for name, data in self.files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(data)


def _apply_write(buf: bytearray, offset: int, data: bytes, keep: list[bool] | None, zeros: bool = False) -> None:
    """Apply a write to ``buf``: whole, or only the sectors ``keep`` marks (the rest untouched, zero past the end)."""
    if keep is None:
        end = offset + len(data)
        if len(buf) < end:
            buf.extend(bytes(end - len(buf)))
        buf[offset:end] = bytes(len(data)) if zeros else data
        return
    for i, (lo, hi) in enumerate(_sectors(offset, len(data))):
        if keep[i]:
            if len(buf) < hi:
                buf.extend(bytes(hi - len(buf)))
            buf[lo:hi] = data[lo - offset : hi - offset]


def _sectors(offset: int, length: int) -> list[tuple[int, int]]:
    """The pieces of ``[offset, offset+length)`` split at sector boundaries."""
    out = []
    pos, end = offset, offset + length
    while pos < end:
        nxt = min((pos // SECTOR + 1) * SECTOR, end)
        out.append((pos, nxt))
        pos = nxt
    return out


def _apply(buf: bytearray, op: Op) -> None:
    if op[0] == "w":
        _apply_write(buf, op[1], op[2], None)
    else:
        del buf[op[1] :]


class SimDisk:
    """Records the engine's operations under ``root`` (see the module doc)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.ops: list[Op] = []
        self._next_ident = 0
        self._by_ino: dict[int, int] = {}  # st_ino -> ident of the file now holding that inode
        self._names: dict[str, int] = {}  # relative path -> ident, as the real tree stands
        self._initial_dirs: list[str] = []
        self._initial_files: list[tuple[str, int, bytes]] = []
        for dirpath, dirs, files in os.walk(self.root):
            rel_dir = os.path.relpath(dirpath, self.root)
            for d in sorted(dirs):
                self._initial_dirs.append(os.path.normpath(os.path.join(rel_dir, d)))
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                rel = os.path.normpath(os.path.join(rel_dir, name))
                with open(path, "rb") as f:
                    data = f.read()
                ident = self._new_ident(os.stat(path).st_ino)
                self._names[rel] = ident
                self._initial_files.append((rel, ident, data))

    # ------------------------------------------------------------ recording

    def _new_ident(self, ino: int) -> int:
        self._next_ident += 1
        self._by_ino[ino] = self._next_ident
        return self._next_ident

    def _rel(self, path: str) -> str | None:
        path = os.path.abspath(path)
        if path == self.root or not path.startswith(self.root + os.sep):
            return None
        return os.path.relpath(path, self.root)

    def _ident(self, fd: int) -> int | None:
        return self._by_ino.get(os.fstat(fd).st_ino)

    def __call__(self, kind: str, *args: Any) -> None:
        if kind in ("write", "sync", "truncate"):
            ident = self._ident(args[0])
            if ident is not None:
                self.ops.append((kind, ident, *args[1:]))
            return
        if kind == "create":
            path, fd = args
            rel = self._rel(path)
            if rel is None:
                return
            st = os.fstat(fd)
            known = self._names.get(rel)
            if known is not None and self._by_ino.get(st.st_ino) == known:
                if st.st_size == 0:
                    self.ops.append(("truncate", known, 0))  # O_TRUNC of an existing file
                return
            ident = self._new_ident(st.st_ino)
            self._names[rel] = ident
            self.ops.append(("create", rel, ident))
            return
        if kind == "rename":
            src, dst = (self._rel(p) for p in args)
            if src is None or dst is None:
                return
            for name in [n for n in self._names if n == src or n.startswith(src + os.sep)]:
                self._names[dst + name[len(src) :]] = self._names.pop(name)
            self.ops.append(("rename", src, dst))
            return
        if kind == "link":
            src, dst = (self._rel(p) for p in args)
            if src is None or dst is None or src not in self._names:
                return
            self._names[dst] = self._names[src]
            self.ops.append(("link", src, dst))
            return
        rel = self._rel(args[0])
        if rel is None and kind == "dirsync" and os.path.abspath(args[0]) == self.root:
            rel = "."  # the root's own entries (a quarantine/ made in the data directory)
        if rel is None:
            return
        if kind in ("unlink", "rmtree"):
            for name in [n for n in self._names if n == rel or n.startswith(rel + os.sep)]:
                del self._names[name]
        self.ops.append((kind, rel))  # dirsync, mkdir, unlink, rmtree

    # ------------------------------------------------------------ replaying

    def states(self) -> Iterator[tuple[int, _Model]]:
        """``(k, model)`` after each of the first ``k`` operations, k = 0..len(ops); one model, updated in place."""
        model = _Model(self._initial_dirs, self._initial_files)
        yield 0, model
        for k, op in enumerate(self.ops, 1):
            model.apply(op)
            yield k, model

    def describe(self, k: int) -> str:
        """The operation a cut at ``k`` falls after (for failure messages)."""
        return "before any operation" if k == 0 else f"after op {k} {_short(self.ops[k - 1])}"


def _short(op: Op) -> str:
    return repr(tuple(f"<{len(a)} bytes>" if isinstance(a, bytes) else a for a in op))


class _Model:
    """The directory as the operations so far left it: current and durable views."""

    def __init__(self, dirs: list[str], files: list[tuple[str, int, bytes]]) -> None:
        self.top = _Dir()
        self.files: dict[int, _File] = {}
        #: Directory changes not yet covered by a sync of every directory they touch:
        #: (operation, directories still to sync, the node it created or moved).
        self.uncovered: list[tuple[Op, list[_Dir], _File | _Dir | None]] = []
        for d in dirs:
            parent, name = self._parent(d)
            node = _Dir()
            parent.current[name] = parent.durable[name] = node
        for rel, ident, data in files:
            parent, name = self._parent(rel)
            f = _File(ident, bytearray(data), bytearray(data))
            self.files[ident] = f
            parent.current[name] = parent.durable[name] = f

    def _dir(self, rel: str) -> _Dir:
        node: _File | _Dir = self.top
        if rel not in ("", "."):
            for part in rel.split(os.sep):
                assert isinstance(node, _Dir)
                node = node.current[part]
        assert isinstance(node, _Dir), rel
        return node

    def _parent(self, rel: str) -> tuple[_Dir, str]:
        head, name = os.path.split(rel)
        return self._dir(head), name

    def apply(self, op: Op) -> None:
        kind = op[0]
        if kind == "write":
            f = self.files[op[1]]
            f.pending.append(("w", op[2], op[3]))
            _apply(f.current, f.pending[-1])
        elif kind == "truncate":
            f = self.files[op[1]]
            f.pending.append(("t", op[2]))
            _apply(f.current, f.pending[-1])
        elif kind == "sync":
            f = self.files[op[1]]
            f.durable = bytearray(f.current)
            f.pending.clear()
        elif kind == "create":
            parent, name = self._parent(op[1])
            f = _File(op[2])
            self.files[op[2]] = f
            parent.current[name] = f
            self.uncovered.append((op, [parent], f))
        elif kind == "mkdir":
            parent, name = self._parent(op[1])
            parent.current[name] = d = _Dir()
            self.uncovered.append((op, [parent], d))
        elif kind == "dirsync":
            d = self._dir(op[1])
            d.durable = dict(d.current)
            for _op, dirs, _node in self.uncovered:
                while d in dirs:
                    dirs.remove(d)
            self.uncovered = [u for u in self.uncovered if u[1]]
        elif kind == "rename":
            sp, sn = self._parent(op[1])
            dp, dn = self._parent(op[2])
            node = dp.current[dn] = sp.current.pop(sn)
            self.uncovered.append((op, [sp, dp], node))
        elif kind == "link":
            sp, sn = self._parent(op[1])
            dp, dn = self._parent(op[2])
            node = dp.current[dn] = sp.current[sn]  # the same file under a second name
            self.uncovered.append((op, [dp], node))
        elif kind in ("unlink", "rmtree"):
            parent, name = self._parent(op[1])
            del parent.current[name]
            self.uncovered.append((op, [parent], None))
        else:  # pragma: no cover
            raise AssertionError(f"unknown operation {op!r}")

    # -------------------------------------------------------- power cuts

    def pending_data(self) -> int:
        """Unsynced writes and truncates still pending in reachable files."""
        return sum(len(f.pending) for f in self.files.values())

    def strict(self, policy: str, rng: random.Random | None = None) -> Image:
        """The strict model's disk: directory entries as last synced, file data per ``policy``.

        ``drop``: everything unsynced lost; ``keep``: every unsynced write
        reached the disk (only the directory rollback bites); ``random``:
        each pending operation dropped, applied, torn or zeroed (``rng``),
        and each directory change not covered kept or not.
        """

        def content(f: _File) -> bytes:
            if policy == "drop" or not f.pending:
                return bytes(f.durable)
            if policy == "keep":
                return bytes(f.current)
            assert rng is not None
            buf = bytearray(f.durable)
            for op in f.pending:
                if op[0] == "t":
                    if rng.random() < 0.5:
                        _apply(buf, op)
                    continue
                roll = rng.random()
                if roll < 0.3:
                    continue  # dropped
                if roll < 0.55:
                    _apply(buf, op)
                elif roll < 0.85:
                    n = len(_sectors(op[1], len(op[2])))
                    _apply_write(buf, op[1], op[2], [rng.random() < 0.5 for _ in range(n)])
                else:
                    _apply_write(buf, op[1], op[2], None, zeros=True)
            return bytes(buf)

        view = _durable_view(self.top)
        if policy == "random":
            assert rng is not None
            for op, _dirs, node in self.uncovered:
                if rng.random() < 0.5:
                    _replay(view, op, node)
        dirs: set[str] = set()
        files: list[tuple[str, bytes]] = []

        def walk(d: dict[str, Any], prefix: str) -> None:
            for name, node in sorted(d.items()):
                rel = os.path.join(prefix, name) if prefix else name
                if isinstance(node, dict):
                    dirs.add(rel)
                    walk(node, rel)
                else:
                    files.append((rel, content(node)))

        walk(view, "")
        return Image(frozenset(dirs), tuple(files))

    def lenient(self, tear: Op | None, rng: random.Random) -> Image:
        """The ordered model's disk: everything so far, in order, and ``tear`` (the next write) partly."""
        torn: dict[int, bytes] = {}
        if tear is not None and tear[0] == "write":
            f = self.files[tear[1]]
            buf = bytearray(f.current)
            pieces = _sectors(tear[2], len(tear[3]))
            cut = rng.randrange(len(pieces) + 1)  # in order: a prefix of the sectors
            _apply_write(buf, tear[2], tear[3], [i < cut for i in range(len(pieces))])
            torn[tear[1]] = bytes(buf)
        dirs: set[str] = set()
        files: list[tuple[str, bytes]] = []

        def walk(d: _Dir, prefix: str) -> None:
            for name, node in sorted(d.current.items()):
                rel = os.path.join(prefix, name) if prefix else name
                if isinstance(node, _Dir):
                    dirs.add(rel)
                    walk(node, rel)
                else:
                    files.append((rel, torn.get(node.ident, bytes(node.current))))

        walk(self.top, "")
        return Image(frozenset(dirs), tuple(files))


def _durable_view(d: _Dir) -> dict[str, Any]:
    """A directory as its last sync left it, as nested dicts (files as :class:`_File`)."""
    return {name: _durable_view(node) if isinstance(node, _Dir) else node for name, node in d.durable.items()}


def _replay(view: dict[str, Any], op: Op, node: _File | _Dir | None) -> None:
    """Apply one uncovered directory change to a durable view (skipped where it no longer applies)."""

    def parent(rel: str) -> tuple[dict[str, Any] | None, str]:
        head, name = os.path.split(rel)
        d: Any = view
        for part in head.split(os.sep) if head else ():
            d = d.get(part) if isinstance(d, dict) else None
        return (d if isinstance(d, dict) else None), name

    kind = op[0]
    p, name = parent(op[1])
    if p is None:
        return
    if kind == "create":
        p[name] = node
    elif kind == "mkdir":
        assert isinstance(node, _Dir)
        p[name] = _durable_view(node)
    elif kind == "rename":
        if name in p:
            q, dst = parent(op[2])
            if q is not None:
                q[dst] = p.pop(name)
    elif kind == "link":
        q, dst = parent(op[2])
        if q is not None:
            q[dst] = node
    else:
        p.pop(name, None)
