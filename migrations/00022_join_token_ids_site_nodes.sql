-- +goose Up
-- Join token ids take the domain model's prefix, jt_ (they were jtok_).
-- Tokens live a day by default but their rows are kept, so existing ids
-- are rewritten rather than both prefixes accepted on input: every id
-- answered from now on is jt_, and the CHECK keeps it so. A join request
-- names its token, hence the cascading key.
ALTER TABLE join_requests
    DROP CONSTRAINT join_requests_join_token_id_fkey,
    ADD CONSTRAINT join_requests_join_token_id_fkey FOREIGN KEY (join_token_id) REFERENCES join_tokens (id) ON UPDATE CASCADE;
UPDATE join_tokens SET id = 'jt_' || substr(id, 6) WHERE id LIKE 'jtok\_%';
ALTER TABLE join_tokens ADD CONSTRAINT join_tokens_id_prefix CHECK (id LIKE 'jt\_%');

-- A site agent is itself a nodes row with role 'site' (the domain model):
-- it serves its whole site, so it has no pool and names its site instead,
-- and its tenant is the site's owner. Only a site node may lack a pool.
-- Its name is the agent's holder (instance id), unique within its site
-- rather than within the tenant, as two sites' agents may share a host.
-- site_agents stays as the registration's bookkeeping (the site token used,
-- the boot lease's epoch), now naming its node.
ALTER TABLE nodes
    ALTER COLUMN pool_id DROP NOT NULL,
    ADD COLUMN site_id text REFERENCES sites (id),
    ADD CONSTRAINT nodes_pool_or_site CHECK (
        CASE WHEN role = 'site' THEN pool_id IS NULL AND site_id IS NOT NULL ELSE pool_id IS NOT NULL AND site_id IS NULL END);
DROP INDEX nodes_tenant_name;
CREATE UNIQUE INDEX nodes_tenant_name ON nodes (tenant_id, name) WHERE deleted_at IS NULL AND role <> 'site';
CREATE UNIQUE INDEX nodes_site_agent_name ON nodes (site_id, name) WHERE deleted_at IS NULL AND role = 'site';
ALTER TABLE site_agents ADD COLUMN node_id text REFERENCES nodes (id);
CREATE UNIQUE INDEX site_agents_node ON site_agents (node_id);

-- +goose Down
DROP INDEX site_agents_node;
ALTER TABLE site_agents DROP COLUMN node_id;
DELETE FROM authz_resources WHERE id IN (SELECT id FROM nodes WHERE role = 'site');
DELETE FROM node_events WHERE node_id IN (SELECT id FROM nodes WHERE role = 'site');
DELETE FROM nodes WHERE role = 'site';
DROP INDEX nodes_site_agent_name;
DROP INDEX nodes_tenant_name;
CREATE UNIQUE INDEX nodes_tenant_name ON nodes (tenant_id, name) WHERE deleted_at IS NULL;
ALTER TABLE nodes DROP CONSTRAINT nodes_pool_or_site, DROP COLUMN site_id, ALTER COLUMN pool_id SET NOT NULL;

ALTER TABLE join_tokens DROP CONSTRAINT join_tokens_id_prefix;
UPDATE join_tokens SET id = 'jtok_' || substr(id, 4) WHERE id LIKE 'jt\_%';
ALTER TABLE join_requests
    DROP CONSTRAINT join_requests_join_token_id_fkey,
    ADD CONSTRAINT join_requests_join_token_id_fkey FOREIGN KEY (join_token_id) REFERENCES join_tokens (id);
