-- +goose Up
-- Images: signed, content-addressed artifacts named name@version. A row is
-- pending until its bytes are in the tenant's blob store and match its
-- digest and size, then available. The signature is the armored SSH
-- signature text as `ssh-keygen -Y sign` writes it (public, not a secret);
-- verified says it checked out against a signer of image_signers (the
-- image's tenant's or the fleet's, the root tenant's rows), which
-- signer_fingerprint names.
CREATE TABLE images (
    id                 text PRIMARY KEY,
    tenant_id          text NOT NULL,
    name               text NOT NULL CHECK (name ~ '^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$'),
    version            text NOT NULL CHECK (version ~ '^[A-Za-z0-9]([A-Za-z0-9._+-]{0,62}[A-Za-z0-9])?$'),
    format             text NOT NULL CHECK (format IN ('raw', 'qcow2', 'iso')),
    sha256             text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes         bigint NOT NULL CHECK (size_bytes >= 0),
    visibility         text NOT NULL DEFAULT 'private' CHECK (visibility IN ('private', 'public')),
    state              text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'available')),
    verified           boolean NOT NULL DEFAULT false,
    signer_fingerprint text NOT NULL DEFAULT '',
    signature          text NOT NULL DEFAULT '',
    description        text NOT NULL DEFAULT '',
    created_by         text NOT NULL,
    -- The idempotency key of the images.register that made the row, and
    -- the SHA-256 of that request (a retry with the key and the same
    -- request answers this row; another request is CONFLICT).
    idempotency_key    text NOT NULL DEFAULT '',
    request_digest     text NOT NULL DEFAULT '',
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    uploaded_at        timestamptz,
    promoted_at        timestamptz,
    UNIQUE (tenant_id, name, version),
    CHECK (verified = (signer_fingerprint <> '')),
    CHECK (visibility = 'private' OR state = 'available')
);
CREATE INDEX images_tenant_id ON images (tenant_id, id);
CREATE INDEX images_public ON images (name, version) WHERE visibility = 'public';
CREATE INDEX images_signer ON images (signer_fingerprint) WHERE signer_fingerprint <> '';
CREATE UNIQUE INDEX images_idempotency ON images (tenant_id, created_by, idempotency_key) WHERE idempotency_key <> '';

-- The one-time upload tokens images.register mints: only their SHA-256 is
-- kept (like boot tokens), a token uploads the bytes of one image once,
-- and it expires soon.
CREATE TABLE image_uploads (
    token_hash text PRIMARY KEY,
    image_id   text NOT NULL REFERENCES images (id) ON DELETE CASCADE,
    expires_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX image_uploads_image ON image_uploads (image_id);

-- The signer allowlists: a tenant's keys, and the root tenant's rows as
-- the fleet's. fingerprint is as ssh-keygen prints it (SHA256:...).
CREATE TABLE image_signers (
    tenant_id      text NOT NULL,
    fingerprint    text NOT NULL CHECK (fingerprint LIKE 'SHA256:%'),
    authorized_key text NOT NULL,
    comment        text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, fingerprint)
);

-- +goose Down
DROP TABLE image_signers;
DROP TABLE image_uploads;
DROP TABLE images;
