"""Content keys: which Slang code a module or kernel is built from.

A module's content key is a digest of the files Slang read to build it (the module and everything
it imports or includes, as Slang itself lists them) and of their bytes. Compiled modules and kernels
are cached by this key, never by a path or a name: a ``.slang`` file edited in a running notebook,
or one of its imports, has a new key, so the next ``slax.load_module`` builds the new code, while
arrays traced against the old module keep running the old code they were traced with.

Listing the files takes a compile (Slang's front end), so each root's file lists are remembered:
while none of a listed file's bytes changed, the key is known by hashing them again. Their bytes
are kept too: code compiled later from a module's files (the PTX route compiles each kernel from
disk when it is first lowered) is compiled from a snapshot of them where they have been edited
since (:func:`snapshot`), so it is the code that was loaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import tempfile
import threading

from slax._slang_c import dependency_files, relocated

_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")


@dataclasses.dataclass(frozen=True)
class Closure:
    """A module's files as they were when it was built.

    Attributes:
      content: the content key: a digest of ``files``.
      files: (path, sha256 of its bytes) of each file; a generated source is listed as
        ``("<source>", sha256 of its text)``.
      identifiers: every identifier-like word in those files: the names a user wrote.
      texts: the bytes of each file of ``files``, as they were.
    """

    content: str
    files: tuple[tuple[str, str], ...]
    identifiers: frozenset[str]
    texts: tuple[bytes, ...] = dataclasses.field(default=(), compare=False, repr=False)


_lock = threading.Lock()
_closures: dict[str, Closure] = {}
_by_root: dict[str, list[Closure]] = {}


def known_content(root: str, *, source: bool = False) -> str | None:
    """The content key of ``root`` (a module file, or generated Slang source when ``source``) if
    one of its recorded file lists is unchanged on disk, else None (it is new, or was edited)."""
    with _lock:
        candidates = list(_by_root.get(_root_key(root, source), ()))
    for closure in candidates:
        if _unchanged(closure):
            return closure.content
    return None


def record_content(root: str, *, source: bool = False) -> str:
    """Lists the files of ``root`` with Slang, records them and returns its content key.

    Raises:
      SlangCompileError: Slang rejected the module.
    """
    if source:
        name = "slax_source_" + hashlib.sha256(root.encode()).hexdigest()[:16] + ".slang"
        logging.getLogger("slax").debug("listing the Slang files a generated module imports ...")
        paths = [p for p in dependency_files(source=root, name=name) if p != name]
        texts = [("<source>", root.encode())]
    else:
        logging.getLogger("slax").debug("listing the Slang files %s imports ...", root)
        paths = dependency_files(path=root)
        texts = []
    texts += [(os.path.abspath(p), _read(p)) for p in dict.fromkeys(paths)]
    files = tuple((path, hashlib.sha256(data).hexdigest()) for path, data in texts)
    digest = hashlib.sha256("\0".join(f"{path}\0{sha}" for path, sha in files).encode()).hexdigest()
    identifiers = frozenset(w.decode() for _, data in texts for w in _IDENTIFIER.findall(data))
    closure = Closure(digest, files, identifiers, tuple(data for _, data in texts))
    with _lock:
        closure = _closures.setdefault(digest, closure)
        recorded = _by_root.setdefault(_root_key(root, source), [])
        if closure not in recorded:
            recorded.append(closure)
    return closure.content


def content_of(root: str, *, source: bool = False) -> str:
    """The content key of ``root`` as it is now (listing its files if they are new or edited)."""
    return known_content(root, source=source) or record_content(root, source=source)


def identifiers(content: str) -> frozenset[str]:
    """The identifiers in the files of the module with key ``content``."""
    return _closures[content].identifiers


def texts(content: str) -> tuple[str, ...]:
    """The text of each file of the module with key ``content``, as it was when loaded."""
    return tuple(data.decode(errors="replace") for data in _closures[content].texts)


def require_unchanged(content: str, what: str) -> None:
    """Raises if a file of the module with key ``content`` changed since it was loaded: code
    built from disk now would not be the code that was loaded (and traced against)."""
    closure = _closures[content]
    changed = [path for path, sha in closure.files if path != "<source>" and _sha(path) != sha]
    if changed:
        raise RuntimeError(
            f"slax: {what} was loaded from Slang files that have changed since ({', '.join(changed)}), "
            "and slax cannot build the old code from them again here. Call slax.load_module again "
            "to use the new code, and call it through the new module."
        )


def snapshot(content: str) -> str | None:
    """None while the files of the module with key ``content`` are unchanged on disk; once one was
    edited, a directory holding all of them as they were when loaded, each at its absolute path
    below it (:func:`relocated`): compiling from there builds the loaded code."""
    closure = _closures[content]
    if _unchanged(closure):
        return None
    root = os.path.join(tempfile.gettempdir(), f"slax-{os.getuid()}-snapshots", content)
    for (path, _), data in zip(closure.files, closure.texts):
        if path == "<source>":
            continue
        target = relocated(path, root)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        write_atomically(target, data)
    return root


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Writes ``data`` to ``path`` so that a reader, in this process or another, sees the old file
    or all of the new one, never a part: it is written beside ``path`` under a name of this thread's
    own and renamed over it."""
    partial = f"{os.fspath(path)}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(partial, "wb") as file:
        file.write(data)
    os.replace(partial, path)


def file_digest(content: str, path: str) -> str | None:
    """The sha256 of the bytes ``path`` held when the module with key ``content`` was built from
    it; None where that module was not built from ``path``."""
    return dict(_closures[content].files).get(os.path.abspath(path))


def _unchanged(closure: Closure) -> bool:
    return all(path == "<source>" or _sha(path) == sha for path, sha in closure.files)


def _root_key(root: str, source: bool) -> str:
    if source:
        return "source:" + hashlib.sha256(root.encode()).hexdigest()
    return "path:" + os.path.abspath(root)


def _sha(path: str) -> str | None:
    try:
        return hashlib.sha256(_read(path)).hexdigest()
    except OSError:
        return None


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()
