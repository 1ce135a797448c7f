-- +goose Up
-- A pool's billing mode says what its tenants are billed for what runs on
-- it (metered: usage at the pool's prices; platform-fee: a platform fee
-- on the provider's price; none: nothing, and no budget check). An offer
-- may be suspended (the receiving tenant keeps what runs but creates
-- nothing new) and may exclude regions.
ALTER TABLE pools ADD COLUMN billing_mode text NOT NULL DEFAULT 'metered'
    CHECK (billing_mode IN ('metered', 'platform-fee', 'none'));
ALTER TABLE pool_offers
    ADD COLUMN suspended_at timestamptz,
    ADD COLUMN excluded_regions text[] NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE pool_offers DROP COLUMN excluded_regions, DROP COLUMN suspended_at;
ALTER TABLE pools DROP COLUMN billing_mode;
