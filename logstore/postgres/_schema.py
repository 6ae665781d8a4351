"""The PostgreSQL schema of the store: tables, the listing index, the append function.

Everything lives in one schema (``convmem`` by default) and every table
carries ``site`` first, so the same DDL distributes by site under Citus (see
``deploy/citus.sql``). Payloads are ``bytea`` holding exactly the compact JSON
bytes the local engine stores: never ``jsonb``, which reorders keys, drops
duplicates, rewrites numbers and refuses ``\\u0000``. ``recorded_at`` is kept
as integer microseconds since the Unix epoch, the engine's own unit, so a
migration preserves it exactly.

The conversation row is updated by every append. The listing index contains
``last_appended_at``, so those updates are never HOT; the table is therefore
created with a lower fillfactor (new row versions stay on the same heap page)
and an autovacuum that starts after 1% of the rows changed, instead of 20%,
so dead versions are reclaimed long before they bloat the heap and the index.
"""

from __future__ import annotations

from psycopg import sql

#: Bumped when the DDL changes incompatibly; recorded in ``meta``.
SCHEMA_VERSION = 1

#: SQLSTATE the append function raises when a batch would overfill a conversation.
SQLSTATE_FULL = "CM001"
#: SQLSTATE of ``append_batch_checked`` for a key already used with other items (DETAIL ``first,last``).
SQLSTATE_KEY_CONFLICT = "CM002"
#: SQLSTATE of ``append_batch_checked`` when the next seq is not the expected one (DETAIL the actual one).
SQLSTATE_SEQ_CONFLICT = "CM003"

_DDL = """
CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {schema}.meta (
    key   text COLLATE "C" PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE IF NOT EXISTS {schema}.conversations (
    site             text COLLATE "C" NOT NULL,
    conversation_id  text COLLATE "C" NOT NULL,
    next_seq         bigint NOT NULL,
    created_at       bigint NOT NULL,
    last_appended_at bigint NOT NULL,
    PRIMARY KEY (site, conversation_id)
) WITH (fillfactor = 70,
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 200,
        autovacuum_analyze_scale_factor = 0.02);

CREATE INDEX IF NOT EXISTS conversations_listing
    ON {schema}.conversations (site, last_appended_at DESC, conversation_id);

CREATE TABLE IF NOT EXISTS {schema}.items (
    site            text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C" NOT NULL,
    seq             bigint NOT NULL,
    recorded_at     bigint NOT NULL,
    payload         bytea NOT NULL,
    PRIMARY KEY (site, conversation_id, seq)
);

CREATE TABLE IF NOT EXISTS {schema}.site_credentials (
    site       text COLLATE "C" PRIMARY KEY,
    kdf        text NOT NULL,
    n          integer NOT NULL,
    r          integer NOT NULL,
    p          integer NOT NULL,
    salt       bytea NOT NULL,
    hash       bytea NOT NULL,
    created_at text,
    changed    bigint NOT NULL
);

CREATE SEQUENCE IF NOT EXISTS {schema}.credential_changes;

CREATE TABLE IF NOT EXISTS {schema}.settings (
    key   text COLLATE "C" PRIMARY KEY,
    value text NOT NULL
);

-- The append functions are in _DDL_KEYS (appended to this text by ddl()).

INSERT INTO {schema}.meta (key, value) VALUES ('schema_version', '{version}')
ON CONFLICT (key) DO NOTHING;
"""

#: Idempotency keys and checked appends: additive, so a schema made before them
#: gets them on start-up (:func:`keys_ddl`) and keeps its version; older servers never use them.
#:
#: A key is stored with its batch in the same transaction (one commit: no crash can keep one
#: without the other) and looked up under the conversation row's lock, so appenders on any
#: number of servers see each other's keys. Retention: a key is deleted only when it is older
#: than 24 hours and at least 10,000 newer keyed batches of its conversation exist (hence at
#: least 10,000 newer batches): kept for at least the last 10,000 batches or 24 hours. The
#: sweep runs when an append crosses a multiple of 512 seqs, not on every append.
_DDL_KEYS = """
CREATE TABLE IF NOT EXISTS {schema}.append_keys (
    site            text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C" NOT NULL,
    key             text COLLATE "C" NOT NULL,
    first_seq       bigint NOT NULL,
    last_seq        bigint NOT NULL,
    digest          bytea NOT NULL,
    recorded_at     bigint NOT NULL,
    PRIMARY KEY (site, conversation_id, key)
);

CREATE INDEX IF NOT EXISTS append_keys_by_seq ON {schema}.append_keys (site, conversation_id, first_seq);

-- Servers waiting for a conversation to grow (replay_memory's wait_ms); see _follow.py.
CREATE TABLE IF NOT EXISTS {schema}.followers (
    site            text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C" NOT NULL,
    token           text COLLATE "C" NOT NULL,
    expires_at      bigint NOT NULL,
    PRIMARY KEY (site, conversation_id, token)
);

-- The plain append, as before, plus the notification of followers (when there are any).
CREATE OR REPLACE FUNCTION {schema}.append_batch(
    p_site text, p_conversation_id text, p_payloads bytea[], p_max_items bigint, p_lock_timeout_ms integer)
RETURNS TABLE (first_seq bigint, last_seq bigint, stamp bigint)
LANGUAGE plpgsql
SET search_path = {schema}, pg_catalog
AS $fn$
BEGIN
    RETURN QUERY SELECT c.first_seq, c.last_seq, c.stamp
      FROM append_batch_checked(p_site, p_conversation_id, p_payloads, p_max_items, p_lock_timeout_ms,
                                NULL::text, NULL::bytea, NULL::bigint) AS c;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.append_batch_checked(
    p_site text, p_conversation_id text, p_payloads bytea[], p_max_items bigint, p_lock_timeout_ms integer,
    p_key text, p_digest bytea, p_expected bigint)
RETURNS TABLE (first_seq bigint, last_seq bigint, stamp bigint, replayed boolean)
LANGUAGE plpgsql
SET search_path = {schema}, pg_catalog
AS $fn$
DECLARE
    n       bigint := cardinality(p_payloads);
    v_next  bigint;
    v_last  bigint;
    v_stamp bigint;
    v_first bigint;
    v_end   bigint;
    v_dig   bytea;
    v_floor bigint;
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    SELECT c.next_seq, c.last_appended_at INTO v_next, v_last
      FROM conversations c
     WHERE c.site = p_site AND c.conversation_id = p_conversation_id
       FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO conversations (site, conversation_id, next_seq, created_at, last_appended_at)
        VALUES (p_site, p_conversation_id, 0, 0, 0)
        ON CONFLICT (site, conversation_id) DO NOTHING;
        SELECT c.next_seq, c.last_appended_at INTO v_next, v_last
          FROM conversations c
         WHERE c.site = p_site AND c.conversation_id = p_conversation_id
           FOR UPDATE;
    END IF;
    IF p_key IS NOT NULL THEN
        SELECT k.first_seq, k.last_seq, k.digest INTO v_first, v_end, v_dig
          FROM append_keys k
         WHERE k.site = p_site AND k.conversation_id = p_conversation_id AND k.key = p_key;
        IF FOUND THEN
            IF v_dig = p_digest THEN
                RETURN QUERY SELECT v_first, v_end, 0::bigint, true;
                RETURN;
            END IF;
            RAISE EXCEPTION USING ERRCODE = '{key_conflict}',
                MESSAGE = 'the idempotency key was used for other items',
                DETAIL = v_first::text || ',' || v_end::text;
        END IF;
    END IF;
    IF p_expected IS NOT NULL AND p_expected <> v_next THEN
        RAISE EXCEPTION USING ERRCODE = '{seq_conflict}',
            MESSAGE = 'the conversation''s next seq is not the expected one',
            DETAIL = v_next::text;
    END IF;
    IF v_next + n > p_max_items THEN
        RAISE EXCEPTION USING ERRCODE = '{full}',
            MESSAGE = 'the batch would take the conversation past its item limit',
            DETAIL = (v_next + n)::text;
    END IF;
    v_stamp := greatest(v_last, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
    UPDATE conversations c
       SET next_seq = v_next + n,
           last_appended_at = v_stamp,
           created_at = CASE WHEN v_next = 0 THEN v_stamp ELSE c.created_at END
     WHERE c.site = p_site AND c.conversation_id = p_conversation_id;
    INSERT INTO items (site, conversation_id, seq, recorded_at, payload)
    SELECT p_site, p_conversation_id, v_next + u.o - 1, v_stamp, u.x
      FROM unnest(p_payloads) WITH ORDINALITY AS u(x, o);
    IF p_key IS NOT NULL THEN
        INSERT INTO append_keys (site, conversation_id, key, first_seq, last_seq, digest, recorded_at)
        VALUES (p_site, p_conversation_id, p_key, v_next, v_next + n - 1, p_digest, v_stamp);
    END IF;
    IF (v_next + n) / 512 <> v_next / 512 THEN
        SELECT k.first_seq INTO v_floor
          FROM append_keys k
         WHERE k.site = p_site AND k.conversation_id = p_conversation_id
         ORDER BY k.first_seq DESC OFFSET 9999 LIMIT 1;
        IF FOUND THEN
            DELETE FROM append_keys k
             WHERE k.site = p_site AND k.conversation_id = p_conversation_id
               AND k.first_seq < v_floor AND k.recorded_at < v_stamp - 86400000000;
        END IF;
    END IF;
    IF EXISTS (SELECT 1 FROM followers f
                WHERE f.site = p_site AND f.conversation_id = p_conversation_id AND f.expires_at > v_stamp) THEN
        PERFORM pg_notify('convmem_follow', current_schema() || '/' || p_site || '/' || p_conversation_id);
    END IF;
    RETURN QUERY SELECT v_next, v_next + n - 1, v_stamp, false;
END
$fn$;
"""


#: Long-term memories: additive like the keys above, so a schema made before them gets
#: them on start-up (:func:`memories_ddl`) and keeps its version.
#:
#: ``memories`` holds each memory's current record (``record``: the compact JSON of its writable
#: fields, ``bytea`` as everywhere here) and the vector computed when it was written (``vec``: the
#: JSON of :mod:`logstore.memories.vectors`' stored form, NULL without a model), so no server
#: encodes a stored memory again. ``dedupe_key`` is a column of its own: the partial unique index
#: ``memories_dedupe`` makes it unique among a site's active memories whatever the servers do.
#: ``change`` is the value of the site's change counter when the row was last written.
#:
#: ``memory_sites`` is one row per site: ``changes`` is bumped by every write of the site (the
#: writer's first statement, which also serialises the site's writers), ``erased`` is the value of
#: ``changes`` at the site's last erasure. A server holding the site at change N reads only rows
#: with ``change > N``, or everything again when ``erased > N`` (an erased row leaves no trace).
#:
#: ``memory_tokens`` holds the nonce of every verify token used in the last token lifetime (ids
#: only, never content): inserted in the transaction of the write the token authorises, so a
#: token is used at most once across all servers.
_DDL_MEMORIES = """
CREATE TABLE IF NOT EXISTS {schema}.memories (
    site             text COLLATE "C" NOT NULL,
    memory_id        text COLLATE "C" NOT NULL,
    status           text NOT NULL,
    version          bigint NOT NULL,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL,
    last_accessed_at bigint NOT NULL,
    deleted_at       bigint,
    dedupe_key       text COLLATE "C",
    record           bytea NOT NULL,
    vec              bytea,
    change           bigint NOT NULL,
    PRIMARY KEY (site, memory_id)
) PARTITION BY HASH (site);

{partitions}
-- No column statistics of the text (ANALYZE would copy sampled values into pg_statistic).
ALTER TABLE {schema}.memories ALTER COLUMN record SET STATISTICS 0, ALTER COLUMN vec SET STATISTICS 0,
    ALTER COLUMN dedupe_key SET STATISTICS 0;

CREATE UNIQUE INDEX IF NOT EXISTS memories_dedupe
    ON {schema}.memories (site, dedupe_key) WHERE status = 'active' AND dedupe_key IS NOT NULL;

CREATE INDEX IF NOT EXISTS memories_by_change ON {schema}.memories (site, change);

CREATE INDEX IF NOT EXISTS memories_deleted
    ON {schema}.memories (deleted_at) WHERE status = 'deleted';

CREATE TABLE IF NOT EXISTS {schema}.memory_sites (
    site    text COLLATE "C" PRIMARY KEY,
    changes bigint NOT NULL,
    erased  bigint NOT NULL
);

CREATE TABLE IF NOT EXISTS {schema}.memory_tokens (
    site    text COLLATE "C" NOT NULL,
    nonce   text COLLATE "C" NOT NULL,
    used_at bigint NOT NULL,
    PRIMARY KEY (site, nonce)
);
"""


#: Rewrites of ``memories`` still owed after an erasure (see ``_memscrub``): one row per site, written in the
#: erasing transaction itself (so no crash can lose it) with that transaction's id, and deleted only once a
#: rewrite of the site's partition is known to have dropped every row version that transaction deleted. The
#: retention sweep retries what is owed. Additive: a schema made before it gets it on start-up.
_DDL_SCRUBS = """
CREATE TABLE IF NOT EXISTS {schema}.memory_scrubs (
    site       text COLLATE "C" PRIMARY KEY,
    erased_xid xid8 NOT NULL,
    owed_since bigint NOT NULL
);
"""


#: Hash partitions of ``memories`` by site: erasing one memory rewrites one of them (``VACUUM FULL``), so the
#: rewrite's ACCESS EXCLUSIVE lock holds up the sites of that partition only. Fixed: changing it is a migration.
MEMORY_PARTITIONS = 16


def memory_partition(remainder: int) -> str:
    """The name of the partition of ``memories`` holding the sites whose hash leaves ``remainder``."""
    return f"memories_p{remainder:02d}"


def _memories_text() -> str:
    parts = "\n".join(
        f"CREATE TABLE IF NOT EXISTS {{schema}}.{memory_partition(r)} PARTITION OF {{schema}}.memories\n"
        f"    FOR VALUES WITH (MODULUS {MEMORY_PARTITIONS}, REMAINDER {r});"
        for r in range(MEMORY_PARTITIONS)
    )
    return _DDL_MEMORIES.replace("{partitions}", parts) + _DDL_SCRUBS


def ddl(schema: str) -> sql.Composed:
    """The idempotent DDL creating the store's objects in ``schema``."""
    text = _DDL.replace("{full}", SQLSTATE_FULL).replace("{version}", str(SCHEMA_VERSION))
    return sql.SQL(text + _keys_text() + _memories_text()).format(schema=sql.Identifier(schema))


def memories_ddl(schema: str) -> sql.Composed:
    """The idempotent DDL of the long-term memory tables alone (for a schema made before them)."""
    return sql.SQL(_memories_text()).format(schema=sql.Identifier(schema))


def scrubs_ddl(schema: str) -> sql.Composed:
    """The idempotent DDL of ``memory_scrubs`` alone (for a schema made before it)."""
    return sql.SQL(_DDL_SCRUBS).format(schema=sql.Identifier(schema))


#: A ``memories`` table made before the partitions becomes the partitioned one in one transaction (the
#: caller's): its rows are copied, then it is dropped, with the dead rows of earlier erasures in its files.
_CONVERT = """
LOCK TABLE {schema}.memories IN ACCESS EXCLUSIVE MODE;
ALTER TABLE {schema}.memories RENAME TO memories_unpartitioned;
ALTER INDEX {schema}.memories_pkey RENAME TO memories_unpartitioned_pkey;
ALTER INDEX {schema}.memories_dedupe RENAME TO memories_unpartitioned_dedupe;
ALTER INDEX {schema}.memories_by_change RENAME TO memories_unpartitioned_by_change;
ALTER INDEX {schema}.memories_deleted RENAME TO memories_unpartitioned_deleted;
"""

_CONVERT_COPY = """
INSERT INTO {schema}.memories SELECT * FROM {schema}.memories_unpartitioned;
DROP TABLE {schema}.memories_unpartitioned;
"""


def partition_memories_ddl(schema: str) -> sql.Composed:
    """The statements turning an unpartitioned ``memories`` into the partitioned table, rows and all."""
    text = _CONVERT + _memories_text() + _CONVERT_COPY
    return sql.SQL(text).format(schema=sql.Identifier(schema))


def _keys_text() -> str:
    return (
        _DDL_KEYS.replace("{full}", SQLSTATE_FULL)
        .replace("{key_conflict}", SQLSTATE_KEY_CONFLICT)
        .replace("{seq_conflict}", SQLSTATE_SEQ_CONFLICT)
    )


def keys_ddl(schema: str) -> sql.Composed:
    """The idempotent DDL of the key table and the checked append alone (for a schema made before them)."""
    return sql.SQL(_keys_text()).format(schema=sql.Identifier(schema))
