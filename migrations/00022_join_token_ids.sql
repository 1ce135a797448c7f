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

-- +goose Down
ALTER TABLE join_tokens DROP CONSTRAINT join_tokens_id_prefix;
UPDATE join_tokens SET id = 'jtok_' || substr(id, 4) WHERE id LIKE 'jt\_%';
ALTER TABLE join_requests
    DROP CONSTRAINT join_requests_join_token_id_fkey,
    ADD CONSTRAINT join_requests_join_token_id_fkey FOREIGN KEY (join_token_id) REFERENCES join_tokens (id);
