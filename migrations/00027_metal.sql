-- +goose Up
-- Bare metal: how a site reaches an enrolled machine's BMC, the lifecycle
-- operation in flight on each node, the ramdisk boots, and the machines
-- that booted a site's discovery ramdisk without being enrolled. The
-- provision state stays on nodes (one column, one answer); the rest of the
-- lifecycle is here, one row per node, written by store/metal.

-- A node's BMC endpoints. Passwords are secret references
-- (secret://<tenant>/<name>), resolved only by the site agent's credential
-- endpoint just before use, never copied here in clear.
CREATE TABLE node_bmcs (
    node_id              text PRIMARY KEY REFERENCES nodes (id),
    tenant_id            text NOT NULL,
    site_id              text NOT NULL REFERENCES sites (id),
    redfish_address      text NOT NULL DEFAULT '',
    redfish_username     text NOT NULL DEFAULT '',
    redfish_password_ref text NOT NULL DEFAULT '' CHECK (redfish_password_ref = '' OR redfish_password_ref LIKE 'secret://%'),
    redfish_ca_pem       text NOT NULL DEFAULT '',
    redfish_insecure     boolean NOT NULL DEFAULT false,
    ipmi_address         text NOT NULL DEFAULT '',
    ipmi_username        text NOT NULL DEFAULT '',
    ipmi_password_ref    text NOT NULL DEFAULT '' CHECK (ipmi_password_ref = '' OR ipmi_password_ref LIKE 'secret://%'),
    -- The MAC the machine network-boots from, and when an operator (or a
    -- matching inspection) confirmed it.
    boot_mac             text NOT NULL DEFAULT '',
    boot_mac_confirmed_at timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CHECK (redfish_address <> '' OR ipmi_address <> '')
);
-- One live node per BMC address in a site: enrolling a machine twice is a
-- CONFLICT, not a second node driving the same power button.
CREATE UNIQUE INDEX node_bmcs_site_redfish ON node_bmcs (site_id, redfish_address) WHERE redfish_address <> '';
CREATE UNIQUE INDEX node_bmcs_site_ipmi ON node_bmcs (site_id, ipmi_address) WHERE ipmi_address <> '';
CREATE INDEX node_bmcs_redfish_ref ON node_bmcs (redfish_password_ref) WHERE redfish_password_ref <> '';
CREATE INDEX node_bmcs_ipmi_ref ON node_bmcs (ipmi_password_ref) WHERE ipmi_password_ref <> '';

-- The lifecycle of an enrolled node: the operation in flight (or ''), its
-- sequence number (the workflow of op_seq N serves only op N), the step in
-- flight, the stable state it started from, its deadline, and whether its
-- workflow start is still owed (workflow_started_at NULL: the row is the
-- outbox, as for reservations).
CREATE TABLE node_metal (
    node_id             text PRIMARY KEY REFERENCES nodes (id),
    tenant_id           text NOT NULL,
    operation           text NOT NULL DEFAULT '',
    op_seq              bigint NOT NULL DEFAULT 0 CHECK (op_seq >= 0),
    op_args             jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(op_args) = 'object'),
    step                text NOT NULL DEFAULT '',
    origin_state        text NOT NULL DEFAULT '',
    -- Where the operation ends on success (core/metal's Target, or for
    -- recover the failed operation's RecoveryFrom), fixed when it begins.
    target_state        text NOT NULL DEFAULT '',
    requested_by        text NOT NULL DEFAULT '',
    op_started_at       timestamptz,
    deadline_at         timestamptz,
    workflow_started_at timestamptz,
    abort_requested_at  timestamptz,
    managed_at          timestamptz,
    inspected_at        timestamptz,
    -- The last failure: {operation, step, code, reason, message, at}.
    last_error          jsonb,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK ((operation = '') = (deadline_at IS NULL))
);
CREATE INDEX node_metal_owed ON node_metal (op_started_at) WHERE operation <> '' AND workflow_started_at IS NULL;
CREATE INDEX node_metal_in_flight ON node_metal (deadline_at) WHERE operation <> '';

-- One boot of a node into the ramdisk. The token the ramdisk reports with
-- is minted once, for the site agent that serves the boot, and stored only
-- as its SHA-256.
CREATE TABLE metal_boots (
    id              text PRIMARY KEY,
    node_id         text NOT NULL REFERENCES nodes (id),
    tenant_id       text NOT NULL,
    site_id         text NOT NULL REFERENCES sites (id),
    op_seq          bigint NOT NULL,
    purpose         text NOT NULL CHECK (purpose IN ('inspect', 'clean', 'deploy', 'rescue')),
    token_hash      bytea UNIQUE,
    token_issued_at timestamptz,
    expires_at      timestamptz NOT NULL,
    reported_at     timestamptz,
    inventory       jsonb,
    hardware_key    text NOT NULL DEFAULT '',
    -- The steps the ramdisk was told to run and what it answered.
    steps           jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(steps) = 'array'),
    results         jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(results) = 'array'),
    finished_at     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX metal_boots_node ON metal_boots (node_id, created_at DESC);

-- A site's discovery token (its SHA-256), which the discovery ramdisk of
-- machines nobody enrolled reports with.
-- Each request of the site agent rotates it: the new token's hash
-- replaces token_hash, and the one it replaced stays valid for a grace
-- period (previous_hash until rotated_at + grace), so ramdisks already
-- booted with it still report while the agent serves the new one.
CREATE TABLE site_discovery_tokens (
    site_id       text PRIMARY KEY REFERENCES sites (id),
    token_hash    bytea NOT NULL UNIQUE,
    previous_hash bytea,
    rotated_at    timestamptz NOT NULL DEFAULT now(),
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Machines that booted a site's discovery ramdisk. tenant_id is the
-- site's owner, the only tenant that lists them.
CREATE TABLE metal_discovered (
    id            text PRIMARY KEY,
    site_id       text NOT NULL REFERENCES sites (id),
    tenant_id     text NOT NULL,
    boot_mac      text NOT NULL,
    hardware_key  text NOT NULL DEFAULT '',
    inventory     jsonb NOT NULL,
    first_seen_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    -- The node it was confirmed as (metal.confirmMac), '' until then.
    node_id       text NOT NULL DEFAULT '',
    UNIQUE (site_id, boot_mac)
);
CREATE INDEX metal_discovered_site ON metal_discovered (site_id, last_seen_at DESC, id);

-- +goose Down
DROP TABLE metal_discovered;
DROP TABLE site_discovery_tokens;
DROP TABLE metal_boots;
DROP TABLE node_metal;
DROP TABLE node_bmcs;
