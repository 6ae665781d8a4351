"""Where things live in a data directory.

Names on disk are the lowercase hex of the UTF-8 id, so ids that differ only
in case stay distinct on case-insensitive filesystems. Conversations fan out
over two levels of 256 directories keyed by a hash of the id, so a million
conversations put about fifteen entries in each leaf directory.

    DATA/logstore.json                       format marker
    DATA/sites/<site-hex>/site.id                            incarnation id; site lock (logstore.incarnation)
    DATA/sites/<site-hex>/manifest.lock
    DATA/sites/<site-hex>/manifest-<epoch>.snap
    DATA/sites/<site-hex>/manifest-<epoch>.log
    DATA/sites/<site-hex>/c/<aa>/<bb>/<conversation-hex>/lock
    DATA/sites/<site-hex>/c/<aa>/<bb>/<conversation-hex>/<base-seq:020d>.seg
    DATA/sites/<site-hex>/c/<aa>/<bb>/<conversation-hex>/<base-seq:020d>.idx
    DATA/sites/<site-hex>/pool/e-<16 hex>/{lock,00000000000000000000.seg}   a ready pool entry
    DATA/sites/<site-hex>/pool/t-<16 hex>/...                              a pool entry being built
    DATA/sites/<site-hex>/c/.spare,  DATA/sites/<site-hex>/c/<aa>/.spare   empty, the next new <aa> / <bb>

The pool (:mod:`logstore.convpool`) holds conversation directories made
ahead of need; nothing that lists a site looks inside it.
"""

from __future__ import annotations

import os

import xxhash

MARKER_FILE = "logstore.json"
FORMAT_NAME = "convmem-logstore"
#: The data directory's format version, in ``logstore.json``. Version 2 adds what an engine of
#: version 1 would misread as damage (and could delete): a claimed pool entry's conversation named
#: by an identity record in its first segment, or by a lock identity (FORMAT.md sections 3 and 6).
#: This engine reads every version in :data:`READABLE_VERSIONS` and raises an older marker to
#: this one when it opens the directory, before it writes anything, so that an older engine
#: refuses the directory instead of misreading it.
FORMAT_VERSION = 2
READABLE_VERSIONS = frozenset({1, 2})
SITES_DIR = "sites"
CONVERSATIONS_DIR = "c"
SEGMENT_SUFFIX = ".seg"
INDEX_SUFFIX = ".idx"
LOCK_FILE = "lock"
#: A site's pool of pre-created conversation directories (see :mod:`logstore.convpool`).
POOL_DIR = "pool"
#: Name prefixes in the pool: a ready entry, and one being built.
POOL_READY_PREFIX = "e-"
POOL_BUILDING_PREFIX = "t-"
#: An empty directory kept in ``c/`` and in each ``c/<aa>/`` (see :mod:`logstore.convpool`),
#: renamed into place as the next new fan-out directory there. Not a fan-out name.
SPARE_DIR = ".spare"


def encode_name(ident: str) -> str:
    """The on-disk directory name of a site or conversation id."""
    return ident.encode("ascii").hex()


def decode_name(name: str) -> str | None:
    """Invert :func:`encode_name`; None when ``name`` is not one of ours."""
    try:
        return bytes.fromhex(name).decode("ascii") if name == name.lower() else None
    except ValueError:
        return None


def site_dir(root: str, site: str) -> str:
    return os.path.join(root, SITES_DIR, encode_name(site))


def pool_dir(site_path: str) -> str:
    """The pool directory of the site directory ``site_path``."""
    return os.path.join(site_path, POOL_DIR)


def site_dir_of_conversation(conversation_path: str) -> str:
    """The site directory above a conversation directory made by :func:`conversation_dir`."""
    return conversation_path.rsplit(os.sep, 4)[0]  # above c/<aa>/<bb>/<conv-hex>


def fanout(conversation_id: str) -> tuple[str, str]:
    h = xxhash.xxh64_hexdigest(conversation_id.encode("ascii"))
    return h[:2], h[2:4]


def conversation_dir(root: str, site: str, conversation_id: str) -> str:
    a, b = fanout(conversation_id)
    return os.path.join(site_dir(root, site), CONVERSATIONS_DIR, a, b, encode_name(conversation_id))


def sites_dir_of_conversation(conversation_path: str) -> str:
    """The ``DATA/sites`` directory above a conversation directory made by :func:`conversation_dir`."""
    return conversation_path.rsplit(os.sep, 5)[0]  # above <site-hex>/c/<aa>/<bb>/<conv-hex>


def segment_name(base_seq: int) -> str:
    return f"{base_seq:020d}{SEGMENT_SUFFIX}"


def index_name(base_seq: int) -> str:
    return f"{base_seq:020d}{INDEX_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The base seq of a segment file name, or None for any other name."""
    if len(name) == 20 + len(SEGMENT_SUFFIX) and name.endswith(SEGMENT_SUFFIX) and name[:20].isdigit():
        return int(name[:20])
    return None
