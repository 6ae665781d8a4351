"""``check``: the whole-directory verification behind ``convmem fsck``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from .. import layout, poolclaims
from ..conversation import Tip
from ..errors import Timeout
from ..ids import ConversationId, SiteName
from ._files import (
    _listdir,
    _segment_bytes,
    _select_sites,
    _valid_id,
    iter_conversations,
)
from ._manifest import (
    _check_manifest,
    _ListingReader,
    _Verified,
    _write_manifest,
)
from ._scanner import _check_conversation
from ._types import (
    _TOP_LEVEL_NAMES,
    ACKNOWLEDGED_LOST,
    CLAIM_NOT_MOVED,
    INTENT_UNRESOLVED,
    LOCK_TIMEOUT,
    STRAY_FILE,
    CheckReport,
    MaintenanceError,
    Problem,
    Progress,
)


def check(
    data_dir: str | os.PathLike[str],
    site: str | None = None,
    conversation: str | None = None,
    *,
    repair: bool = False,
    truncate_at_corruption: bool = False,
    progress: Callable[[Progress], None] | None = None,
    lock_timeout: float = 30.0,
) -> CheckReport:
    """Verify a data directory (or one site, or one conversation) and optionally repair it.

    Checks every record's framing and checksum, seqs gapless within and across
    segments, batches whole, ``recorded_at`` never decreasing, every sparse
    index against its segment, the site manifest against the conversations, and
    stray files. With ``repair`` it truncates torn tails, rebuilds indexes,
    removes orphan indexes and rewrites stale manifests; damage to acknowledged
    data is left in place unless ``truncate_at_corruption`` (which implies
    ``repair``) cuts the log at its first damaged record, after copying the
    segments it cuts into ``DATA/quarantine/``.

    Raises :class:`MaintenanceError` for a directory that is not a data
    directory, a site that does not exist, or a malformed id.
    """
    root = os.path.abspath(os.fspath(data_dir))
    repair = repair or truncate_at_corruption
    sites = _select_sites(root, site)
    if conversation is not None and not _valid_id(conversation, ConversationId):
        raise MaintenanceError(f"{conversation!r} is not a valid conversation id")
    report = CheckReport(sites=len(sites))
    if site is None and conversation is None:
        for name in _listdir(root):
            if name in _TOP_LEVEL_NAMES or ".tmp" in name:
                continue
            report.problems.append(
                Problem(
                    None,
                    None,
                    os.path.join(root, name),
                    None,
                    STRAY_FILE,
                    "a file the engine does not create",
                    "none: not engine data; move it out of the data directory if it is not needed",
                )
            )
        for name in _listdir(os.path.join(root, layout.SITES_DIR)):
            decoded = layout.decode_name(name)
            if name.startswith(".dropped-") or (decoded is not None and _valid_id(decoded, SiteName)):
                continue
            report.problems.append(
                Problem(
                    None,
                    None,
                    os.path.join(root, layout.SITES_DIR, name),
                    None,
                    STRAY_FILE,
                    "not a site directory",
                    "none: not engine data; move it out of the data directory if it is not needed",
                )
            )
    plan: list[tuple[str, Iterable[tuple[str, str]]]] = []
    unmoved: dict[str, set[str]] = {}
    for s in sites:
        unmoved[s] = _claims_not_moved(root, s, conversation, repair, report.problems)
        if conversation is not None:
            cdir = layout.conversation_dir(root, s, conversation)
            if os.path.isdir(cdir):
                plan.append((s, [(conversation, cdir)]))
        else:
            plan.append((s, iter_conversations(root, s, report.problems)))
    if conversation is not None and not plan and not any(unmoved.values()):
        where = f"site {site!r}" if site is not None else "any site"
        raise MaintenanceError(f"conversation {conversation!r} does not exist in {where}")
    totals = (0, 0)
    if progress is not None:
        listed = [(s, list(convs)) for s, convs in plan]
        totals = (sum(len(c) for _, c in listed), sum(_segment_bytes(d) for _, c in listed for _, d in c))
        plan = [(s, c) for s, c in listed]
    done = 0
    for s, convs in plan:
        tips: dict[str, Tip | None] = {}
        damaged: set[str] = set()
        truncated: set[str] = set()
        first_problem = len(report.problems)
        listing = _ListingReader(layout.site_dir(root, s), lock_timeout)
        for cid, cdir in convs:
            res = _check_conversation(root, s, cid, cdir, repair, truncate_at_corruption, lock_timeout, listing)
            done += 1
            if res is not None:
                report.problems.extend(res.problems)
                report.conversations += 1
                report.records += res.records
                report.bytes_scanned += res.bytes
                report.segments += res.segments
                if res.damaged:
                    damaged.add(cid)
                else:
                    tips[cid] = res.tip
                if res.truncated:
                    truncated.add(cid)
            if progress is not None:
                progress(Progress(done, totals[0], report.bytes_scanned, totals[1]))
        if not os.path.isdir(layout.site_dir(root, s)):
            del report.problems[first_problem:]  # the site was dropped while we looked at it
            continue
        if conversation is not None and conversation not in tips and conversation not in damaged:
            tips[conversation] = None
        site_problems = _check_site_manifest(root, s, tips, damaged, truncated, conversation, repair, lock_timeout)
        for p in site_problems:
            if p.conversation_id in unmoved.get(s, ()):
                # Its log is in a claimed entry not yet moved into place (reported above): the engine's
                # next use of the site moves it, and its listing then agrees with it.
                p.resolves_itself = True
                p.action = "none: the conversation's log is in a claimed pool entry the engine moves into place"
        report.problems.extend(site_problems)
    return report


def _claims_not_moved(
    root: str, site: str, conversation: str | None, repair: bool, problems: list[Problem]
) -> set[str]:
    """Report the site's claimed pool entries not at their place (moved with ``repair``); ids left unmoved."""
    sdir = layout.site_dir(root, site)
    found = [u for u in poolclaims.unmoved(sdir) if conversation is None or u.conversation_id == conversation]
    if not found:
        return set()
    moved: set[str] = set()
    if repair:
        done, _left = poolclaims.finish(sdir)
        moved = {u.path for u in done}
    left: set[str] = set()
    for u in found:
        target = layout.conversation_dir(root, site, u.conversation_id)
        what = poolclaims.fate(sdir, u) if u.path not in moved else None
        if what == poolclaims.OLD_NAME:
            problems.append(Problem(
                site, u.conversation_id, u.path, None, CLAIM_NOT_MOVED,
                f"the old name of {target}: a power cut kept a claimed pool entry's rename into place and "
                "not the removal of its old name", "none needed: the engine removes it at its next use of the site "
                "(or run --repair)", resolves_itself=True))
        elif u.path in moved:
            problems.append(Problem(
                site, u.conversation_id, u.path, None, CLAIM_NOT_MOVED,
                "a first append claimed this pool entry and was acknowledged; a power cut undid its move "
                "into place", f"moved to {target} and synced (or removed, as the old name of that directory)",
                repaired=True))
        elif what == poolclaims.CONFLICT:
            problems.append(Problem(
                site, u.conversation_id, u.path, None, CLAIM_NOT_MOVED,
                f"a claimed pool entry holds a log of conversation {u.conversation_id!r}, which has a directory "
                "too: the engine reads that directory and leaves this one alone",
                "none automatic: compare the two logs (convmem dump) and keep the right one"))
        else:
            left.add(u.conversation_id)
            problems.append(Problem(
                site, u.conversation_id, u.path, None, CLAIM_NOT_MOVED,
                "a first append claimed this pool entry and was acknowledged; a power cut undid its move "
                "into place, so its conversation is read from here until it is moved",
                "none needed: the engine moves it into place at its next use of the site (or run --repair)",
                resolves_itself=True))
    return left


def _check_site_manifest(
    root: str,
    site: str,
    tips: dict[str, Tip | None],
    damaged: set[str],
    truncated: set[str],
    conversation: str | None,
    repair: bool,
    lock_timeout: float,
) -> list[Problem]:
    """The manifest's problems, rewritten when repairing (always after a log was cut).

    Lost acknowledged items are never marked repaired: the rewrite only makes
    the listing agree with the log.
    """
    verified: dict[str, _Verified] = {}
    problems = _check_manifest(root, site, tips, damaged, conversation, lock_timeout, verified)
    for p in problems:
        p.owed_commit = _owed(p, verified)
    if truncated or (repair and any(p.kind != LOCK_TIMEOUT and not p.owed_commit for p in problems)):
        try:
            _write_manifest(root, site, tips, truncated, conversation is None, lock_timeout, verified)
        except (Timeout, OSError) as exc:
            for p in problems:
                p.action = f"rewriting the manifest failed: {exc}"
        else:
            for p in problems:
                if p.kind == ACKNOWLEDGED_LOST and p.conversation_id in truncated:
                    # The operator chose to cut this log; the cut's problem names what it dropped.
                    p.repaired = True
                    p.action = "rewrote the manifest to the extent of the log as cut by --truncate-at-corruption"
                elif p.kind == ACKNOWLEDGED_LOST:
                    p.action = (
                        "rewrote the manifest to the log's extent; the lost items cannot be recovered by fsck: "
                        "restore the conversation from an export (`convmem import --conversation`)"
                    )
                elif p.kind != LOCK_TIMEOUT:
                    p.repaired = True
                    p.action = "rewrote the manifest from the conversations"
    return problems


def _owed(p: Problem, verified: dict[str, _Verified]) -> bool:
    """An intent whose batch is exactly what the log holds: a live writer may still owe its commit.

    A writer logs a batch's commit with its next intent for the conversation
    or when it closes (FORMAT.md 5), so an idle writer leaves this state
    behind every conversation it wrote last; so does one that died after the
    data sync. Nothing in the data or the listing is wrong (the engine's next
    listing reads the log), so ``--repair`` alone does not rewrite the
    manifest for it (a live directory stays clean); a rewrite made for another
    problem settles it too.
    """
    v = verified.get(p.conversation_id or "")
    return (
        p.kind == INTENT_UNRESOLVED
        and v is not None
        and v.pending is not None
        and v.truth is not None
        and v.truth.next_seq == v.pending[2]
    )
