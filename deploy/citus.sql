-- convmem on Citus: the PostgreSQL backend's schema, distributed by site.
--
-- Citus cannot be installed from the package registries this project builds
-- from, so no test runs this file on Citus. It was written against Citus's own
-- documentation (create_distributed_table, create_reference_table,
-- create_distributed_function, isolate_tenant_to_new_shard,
-- citus_move_shard_placement; the router planner's rules).
-- tests/test_pg_citus_sql.py runs it on plain PostgreSQL with stand-ins for
-- Citus's functions and checks that its tables, indexes, options and the append
-- function are exactly those the server's own DDL (logstore/postgres/_schema.py)
-- creates, and that every table is distributed by site or replicated.
--
-- Run it on the coordinator, as the owner of the database, BEFORE any
-- `convmem serve --store postgresql://coordinator/...` starts (the server
-- then finds schema version 1 in convmem.meta and leaves the DDL alone), or
-- after `convmem migrate` has filled plain tables (create_distributed_table
-- moves existing rows into shards).
--
-- Design rules this file follows:
--  * every table that grows with the data carries `site` and is hash-distributed
--    by it, and all of them are in ONE co-location group, so a site's
--    conversations and items always live on the same node;
--  * every primary key starts with `site` (Citus requires unique constraints to
--    contain the distribution column);
--  * every statement the server issues filters on one `site` value and never
--    joins two tables, so the router planner sends it to one shard; the only
--    multi-shard statement is the operator-side `SELECT DISTINCT site` behind
--    `convmem migrate` (a parallel scan, never a join);
--  * the append is ONE function call whose first argument is the site, distributed
--    with create_distributed_function(..., 'p_site', colocate_with := ...), so
--    Citus runs the whole call on the node holding that site's shards. Inside it
--    there is no INSERT ... WITH (CTE) and no non-immutable function in an
--    ON CONFLICT ... SET clause (the router planner rejects both): the clock is
--    read into a plpgsql variable and passed to plain UPDATE/INSERT statements;
--  * names inside the function are schema-qualified: Citus does not carry the
--    caller's search_path to the worker that executes a delegated function.

CREATE EXTENSION IF NOT EXISTS citus;

CREATE SCHEMA IF NOT EXISTS convmem;

CREATE TABLE convmem.meta (
    key   text COLLATE "C" PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE convmem.conversations (
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

CREATE INDEX conversations_listing
    ON convmem.conversations (site, last_appended_at DESC, conversation_id);

CREATE TABLE convmem.items (
    site            text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C" NOT NULL,
    seq             bigint NOT NULL,
    recorded_at     bigint NOT NULL,
    payload         bytea NOT NULL,
    PRIMARY KEY (site, conversation_id, seq)
);

-- Small tables every node reads: site passwords (scrypt hashes), settings.
CREATE TABLE convmem.site_credentials (
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
CREATE SEQUENCE convmem.credential_changes;
CREATE TABLE convmem.settings (
    key   text COLLATE "C" PRIMARY KEY,
    value text NOT NULL
);

-- Distribution. conversations is distributed first; items joins its co-location
-- group explicitly (same column type, same shard count). A site's rows in both
-- tables hash to the same shard index, hence the same node.
SELECT create_distributed_table('convmem.conversations', 'site');
SELECT create_distributed_table('convmem.items', 'site', colocate_with => 'convmem.conversations');
SELECT create_reference_table('convmem.site_credentials');
SELECT create_reference_table('convmem.settings');
SELECT create_reference_table('convmem.meta');

-- Idempotency keys, followers and the appends: same DDL and bodies as logstore/postgres/_schema.py
-- (_DDL_KEYS), with every name qualified. The plain append delegates to the checked one; both run
-- on the node holding the site's shards (distributed below), and the tables are co-located.
-- Following (replay_memory's wait_ms) relies on NOTIFY, which a worker sends to its own node:
-- servers LISTENing on the coordinator do not hear it, so on Citus a waiting call sees a new item
-- at its next re-check (every 5 seconds, logstore/postgres/_follow.py) rather than at once.
CREATE TABLE IF NOT EXISTS convmem.append_keys (
    site            text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C" NOT NULL,
    key             text COLLATE "C" NOT NULL,
    first_seq       bigint NOT NULL,
    last_seq        bigint NOT NULL,
    digest          bytea NOT NULL,
    recorded_at     bigint NOT NULL,
    PRIMARY KEY (site, conversation_id, key)
);

CREATE INDEX IF NOT EXISTS append_keys_by_seq ON convmem.append_keys (site, conversation_id, first_seq);

-- Servers waiting for a conversation to grow (replay_memory's wait_ms); see _follow.py.
CREATE TABLE IF NOT EXISTS convmem.followers (
    site            text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C" NOT NULL,
    token           text COLLATE "C" NOT NULL,
    expires_at      bigint NOT NULL,
    PRIMARY KEY (site, conversation_id, token)
);

-- The plain append, as before, plus the notification of followers (when there are any).
CREATE OR REPLACE FUNCTION convmem.append_batch(
    p_site text, p_conversation_id text, p_payloads bytea[], p_max_items bigint, p_lock_timeout_ms integer)
RETURNS TABLE (first_seq bigint, last_seq bigint, stamp bigint)
LANGUAGE plpgsql
AS $fn$
BEGIN
    RETURN QUERY SELECT c.first_seq, c.last_seq, c.stamp
      FROM convmem.append_batch_checked(p_site, p_conversation_id, p_payloads, p_max_items, p_lock_timeout_ms,
                                NULL::text, NULL::bytea, NULL::bigint) AS c;
END
$fn$;

CREATE OR REPLACE FUNCTION convmem.append_batch_checked(
    p_site text, p_conversation_id text, p_payloads bytea[], p_max_items bigint, p_lock_timeout_ms integer,
    p_key text, p_digest bytea, p_expected bigint)
RETURNS TABLE (first_seq bigint, last_seq bigint, stamp bigint, replayed boolean)
LANGUAGE plpgsql
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
    PERFORM pg_catalog.set_config('lock_timeout', p_lock_timeout_ms::text, true);
    SELECT c.next_seq, c.last_appended_at INTO v_next, v_last
      FROM convmem.conversations c
     WHERE c.site = p_site AND c.conversation_id = p_conversation_id
       FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO convmem.conversations (site, conversation_id, next_seq, created_at, last_appended_at)
        VALUES (p_site, p_conversation_id, 0, 0, 0)
        ON CONFLICT (site, conversation_id) DO NOTHING;
        SELECT c.next_seq, c.last_appended_at INTO v_next, v_last
          FROM convmem.conversations c
         WHERE c.site = p_site AND c.conversation_id = p_conversation_id
           FOR UPDATE;
    END IF;
    IF p_key IS NOT NULL THEN
        SELECT k.first_seq, k.last_seq, k.digest INTO v_first, v_end, v_dig
          FROM convmem.append_keys k
         WHERE k.site = p_site AND k.conversation_id = p_conversation_id AND k.key = p_key;
        IF FOUND THEN
            IF v_dig = p_digest THEN
                RETURN QUERY SELECT v_first, v_end, 0::bigint, true;
                RETURN;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'CM002',
                MESSAGE = 'the idempotency key was used for other items',
                DETAIL = v_first::text || ',' || v_end::text;
        END IF;
    END IF;
    IF p_expected IS NOT NULL AND p_expected <> v_next THEN
        RAISE EXCEPTION USING ERRCODE = 'CM003',
            MESSAGE = 'the conversation''s next seq is not the expected one',
            DETAIL = v_next::text;
    END IF;
    IF v_next + n > p_max_items THEN
        RAISE EXCEPTION USING ERRCODE = 'CM001',
            MESSAGE = 'the batch would take the conversation past its item limit',
            DETAIL = (v_next + n)::text;
    END IF;
    v_stamp := greatest(v_last, (extract(epoch FROM pg_catalog.clock_timestamp()) * 1000000)::bigint);
    UPDATE convmem.conversations c
       SET next_seq = v_next + n,
           last_appended_at = v_stamp,
           created_at = CASE WHEN v_next = 0 THEN v_stamp ELSE c.created_at END
     WHERE c.site = p_site AND c.conversation_id = p_conversation_id;
    INSERT INTO convmem.items (site, conversation_id, seq, recorded_at, payload)
    SELECT p_site, p_conversation_id, v_next + u.o - 1, v_stamp, u.x
      FROM unnest(p_payloads) WITH ORDINALITY AS u(x, o);
    IF p_key IS NOT NULL THEN
        INSERT INTO convmem.append_keys (site, conversation_id, key, first_seq, last_seq, digest, recorded_at)
        VALUES (p_site, p_conversation_id, p_key, v_next, v_next + n - 1, p_digest, v_stamp);
    END IF;
    IF (v_next + n) / 512 <> v_next / 512 THEN
        SELECT k.first_seq INTO v_floor
          FROM convmem.append_keys k
         WHERE k.site = p_site AND k.conversation_id = p_conversation_id
         ORDER BY k.first_seq DESC OFFSET 9999 LIMIT 1;
        IF FOUND THEN
            DELETE FROM convmem.append_keys k
             WHERE k.site = p_site AND k.conversation_id = p_conversation_id
               AND k.first_seq < v_floor AND k.recorded_at < v_stamp - 86400000000;
        END IF;
    END IF;
    IF EXISTS (SELECT 1 FROM convmem.followers f
                WHERE f.site = p_site AND f.conversation_id = p_conversation_id AND f.expires_at > v_stamp) THEN
        PERFORM pg_catalog.pg_notify('convmem_follow', pg_catalog.current_schema() || '/' || p_site || '/' || p_conversation_id);
    END IF;
    RETURN QUERY SELECT v_next, v_next + n - 1, v_stamp, false;
END
$fn$;

SELECT create_distributed_table('convmem.append_keys', 'site', colocate_with => 'convmem.conversations');
SELECT create_distributed_table('convmem.followers', 'site', colocate_with => 'convmem.conversations');

-- Route each call to the node holding p_site's shards. force_delegation is left
-- at its default: the server calls the function as a single autocommit statement,
-- outside any explicit transaction, which is where Citus delegates calls.
SELECT create_distributed_function(
    'convmem.append_batch(text, text, bytea[], bigint, integer)',
    distribution_arg_name := 'p_site',
    colocate_with := 'convmem.conversations');
SELECT create_distributed_function(
    'convmem.append_batch_checked(text, text, bytea[], bigint, integer, text, bytea, bigint)',
    distribution_arg_name := 'p_site',
    colocate_with := 'convmem.conversations');

-- Long-term memories: same DDL as logstore/postgres/_schema.py (_DDL_MEMORIES). Every statement of a
-- memory call filters on one site, and a write's transaction touches only that site's rows of these three
-- co-located tables, so it runs on one node. The retention sweep's `SELECT DISTINCT site` of due memories
-- and `sites()` are the multi-shard reads. A write's pg_notify is sent by the coordinator (it is not inside
-- a delegated function); correctness never depends on it (every call checks the site's change counter).
CREATE TABLE IF NOT EXISTS convmem.memories (
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

-- Hash partitions by site: an erasure rewrites (VACUUM FULL) only the partition holding the site. Citus
-- distributes a partitioned table with its partitions (create_distributed_table below, on the parent), and
-- propagates the VACUUM FULL of a partition to that partition's shards on every worker.
CREATE TABLE IF NOT EXISTS convmem.memories_p00 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 0);
CREATE TABLE IF NOT EXISTS convmem.memories_p01 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 1);
CREATE TABLE IF NOT EXISTS convmem.memories_p02 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 2);
CREATE TABLE IF NOT EXISTS convmem.memories_p03 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 3);
CREATE TABLE IF NOT EXISTS convmem.memories_p04 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 4);
CREATE TABLE IF NOT EXISTS convmem.memories_p05 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 5);
CREATE TABLE IF NOT EXISTS convmem.memories_p06 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 6);
CREATE TABLE IF NOT EXISTS convmem.memories_p07 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 7);
CREATE TABLE IF NOT EXISTS convmem.memories_p08 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 8);
CREATE TABLE IF NOT EXISTS convmem.memories_p09 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 9);
CREATE TABLE IF NOT EXISTS convmem.memories_p10 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 10);
CREATE TABLE IF NOT EXISTS convmem.memories_p11 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 11);
CREATE TABLE IF NOT EXISTS convmem.memories_p12 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 12);
CREATE TABLE IF NOT EXISTS convmem.memories_p13 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 13);
CREATE TABLE IF NOT EXISTS convmem.memories_p14 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 14);
CREATE TABLE IF NOT EXISTS convmem.memories_p15 PARTITION OF convmem.memories
    FOR VALUES WITH (MODULUS 16, REMAINDER 15);
-- No column statistics of the text (ANALYZE would copy sampled values into pg_statistic).
ALTER TABLE convmem.memories ALTER COLUMN record SET STATISTICS 0, ALTER COLUMN vec SET STATISTICS 0,
    ALTER COLUMN dedupe_key SET STATISTICS 0;

CREATE UNIQUE INDEX IF NOT EXISTS memories_dedupe
    ON convmem.memories (site, dedupe_key) WHERE status = 'active' AND dedupe_key IS NOT NULL;

CREATE INDEX IF NOT EXISTS memories_by_change ON convmem.memories (site, change);

CREATE INDEX IF NOT EXISTS memories_deleted
    ON convmem.memories (deleted_at) WHERE status = 'deleted';

CREATE TABLE IF NOT EXISTS convmem.memory_sites (
    site    text COLLATE "C" PRIMARY KEY,
    changes bigint NOT NULL,
    erased  bigint NOT NULL
);

CREATE TABLE IF NOT EXISTS convmem.memory_tokens (
    site    text COLLATE "C" NOT NULL,
    nonce   text COLLATE "C" NOT NULL,
    used_at bigint NOT NULL,
    PRIMARY KEY (site, nonce)
);

-- Rewrites owed after an erasure (see logstore/postgres/_memscrub.py). Under Citus the erasing transaction's id
-- recorded here is the coordinator's, and the horizon check reads the coordinator's sessions and slots only:
-- it does not see a snapshot open on a worker (not run here: Citus cannot be installed on the test machine).
CREATE TABLE IF NOT EXISTS convmem.memory_scrubs (
    site       text COLLATE "C" PRIMARY KEY,
    erased_xid xid8 NOT NULL,
    owed_since bigint NOT NULL
);

SELECT create_distributed_table('convmem.memories', 'site', colocate_with => 'convmem.conversations');
SELECT create_distributed_table('convmem.memory_sites', 'site', colocate_with => 'convmem.conversations');
SELECT create_distributed_table('convmem.memory_tokens', 'site', colocate_with => 'convmem.conversations');
SELECT create_distributed_table('convmem.memory_scrubs', 'site', colocate_with => 'convmem.conversations');

INSERT INTO convmem.meta (key, value) VALUES ('schema_version', '1');

-- A very large site: give it shards of its own (in both co-located tables at once,
-- hence CASCADE), then move them to a dedicated worker. Example for site 'big-tenant-01':
--
--   SELECT isolate_tenant_to_new_shard('convmem.conversations', 'big-tenant-01'::text, 'CASCADE');
--   -- returns the new shard id of convmem.conversations; find its placement:
--   SELECT shardid, nodename, nodeport FROM citus_shards
--    WHERE table_name = 'convmem.conversations'::regclass
--      AND shardid = get_shard_id_for_distribution_column('convmem.conversations', 'big-tenant-01'::text);
--   -- and move it (its co-located items shard moves with it):
--   SELECT citus_move_shard_placement(<shardid>, '<from-node>', <from-port>, '<dedicated-node>', <port>);
--
-- Appends of that site keep running meanwhile (non-blocking transfer where the
-- Citus version supports it); every statement still routes by site, so nothing
-- in convmem changes.
