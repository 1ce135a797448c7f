-- +goose Up
-- A provider pool's instance boots one of the provider's images (a slug or
-- id from providerAccounts.offers), not a registered image: exactly one of
-- image_id and provider_image is set.
ALTER TABLE instances ADD COLUMN provider_image text NOT NULL DEFAULT '';
ALTER TABLE instances ADD CONSTRAINT instances_one_image CHECK ((image_id <> '') <> (provider_image <> ''));

-- +goose Down
ALTER TABLE instances DROP CONSTRAINT instances_one_image;
ALTER TABLE instances DROP COLUMN provider_image;
