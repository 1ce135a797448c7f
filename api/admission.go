package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
)

// An admission decides on the resource a call would create (or change), so
// the draft must exist before the decision:
//
//	transaction 1: the idempotency row, the draft and its projection row
//	(a replay by the same caller returns the stored result here, with no
//	decision; the same key with another body is CONFLICT)
//	RefreshResource, so the decision never reads a stale copy
//	one Require on the draft, then one per Also requirement
//	transaction 2: the handler, the stored result, the audit row and last
//	the seal (a check whose lock is held to the commit)
//
// A crash after transaction 1 leaves a prepared row: the retry with the same
// key finds it and decides on the same draft, so nothing is lost or doubled.

// admit runs an admission's steps 6 and 8.
func (s *Server) admit(ctx context.Context, c *Call, a *rpc.ErasedAdmission) (any, error) {
	var in struct {
		IdempotencyKey string `json:"idempotencyKey"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if _, keyed := c.Method.Schema.Field("idempotencyKey"); keyed && in.IdempotencyKey == "" {
		return nil, core.Errorf(core.CodeInvalidInput, "idempotencyKey is required").
			WithDetails(map[string]any{"field": "idempotencyKey", "reason": "required"})
	}
	d, err := chooseDecision(c.Method, c.Input)
	if err != nil {
		return nil, err
	}
	c.Action, c.DecisionTenant = d.Action, c.TenantID
	hash, err := requestHash(c.Input)
	if err != nil {
		return nil, err
	}
	key := idempotencyKey{tenant: c.TenantID, identity: c.Caller.IdentityID, method: c.Method.FullName(), key: in.IdempotencyKey}
	if key.key == "" {
		return s.runAdmission(ctx, c, a, key, hash, d.Resource.Prefix)
	}
	// In one process, the calls of one session with one key and one body
	// share one run and its answer: concurrent runs would refresh the same
	// draft in this process's projection at once, and a decision made while
	// another refresh holds the row out of it can be a spurious denial. The
	// run outlives a caller that goes away, as it would have alone.
	flight, err := json.Marshal([]string{key.tenant, key.identity, c.Caller.SessionID, c.Caller.SourceIP, key.method, key.key, hex.EncodeToString(hash)})
	if err != nil {
		return nil, fmt.Errorf("admission flight: %w", err)
	}
	shared := context.WithoutCancel(ctx)
	ch := s.admissions.DoChan(string(flight), func() (any, error) { return s.runAdmission(shared, c, a, key, hash, d.Resource.Prefix) })
	select {
	case r := <-ch:
		return r.Val, r.Err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// runAdmission runs an admission's transactions and its decision; key.key
// is empty for a change of an existing row (reservations.extend), prefix
// is the draft's id prefix.
func (s *Server) runAdmission(ctx context.Context, c *Call, a *rpc.ErasedAdmission, key idempotencyKey, hash []byte, prefix string) (any, error) {
	var replay json.RawMessage
	err := s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) { // transaction 1
		// Flushed at commit, so a remote IAM's refresh can wait for exactly it.
		if err := store.SyncCommit(ctx, tx); err != nil {
			return err
		}
		if key.key == "" { // a change of an existing row (reservations.extend)
			c.Resource, err = a.Prepare(ctx, c, tx, "")
			return err
		}
		// Concurrent calls with one key queue here until the first one's
		// transaction 1 commits, so they find its row instead of racing it
		// to the draft's primary key.
		if err := key.serialize(ctx, tx); err != nil {
			return err
		}
		row, found, err := key.lock(ctx, tx)
		switch {
		case err != nil:
			return err
		case found && string(row.hash) != string(hash):
			return core.Errorf(core.CodeConflict, "idempotencyKey %q was used with another request", key.key).
				WithDetails(map[string]any{"field": "idempotencyKey"})
		case found && row.result != nil:
			replay, c.Resource = row.result, row.resource
			return nil
		case found:
			c.Resource = row.resource // prepared before a crash: decide on it again
			return nil
		}
		c.Resource, err = a.Prepare(ctx, c, tx, core.DerivedID(prefix, c.TenantID, c.Caller.IdentityID, key.key))
		if err != nil {
			return err
		}
		return key.insert(ctx, tx, hash, c.Resource)
	})
	if err != nil {
		return nil, err
	}
	if replay != nil {
		return replay, s.start(ctx, c, a)
	}
	if err := s.decideAdmission(ctx, c, a); err != nil {
		// A concurrent call with the same key (this caller's own) may have
		// completed the admission while this one was deciding on the draft
		// it is changing: its stored result is the answer, as for any
		// replay, and the draft is not marked denied.
		if key.key != "" {
			if stored, ok := s.completedResult(ctx, key); ok {
				return stored, s.start(ctx, c, a)
			}
		}
		if a.Denied != nil && errors.Is(err, core.ErrAccessDenied) {
			if derr := s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return a.Denied(ctx, c, tx) }); derr != nil {
				s.deps.Logger.Error("recording a denied admission", "error", derr)
			}
		}
		return nil, err
	}
	var out any
	err = s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { // transaction 2
		if key.key != "" {
			row, found, err := key.lock(ctx, tx)
			if err != nil {
				return err
			}
			if found && row.result != nil { // a concurrent retry finished first
				replay = row.result
				return nil
			}
		}
		if out, err = a.Complete(ctx, c, tx); err != nil {
			return err
		}
		if key.key != "" {
			// Answer the stored form, so the first answer and every replay
			// are the same bytes.
			if out, err = key.complete(ctx, tx, out); err != nil {
				return err
			}
		}
		if err := writeAudit(ctx, tx, c); err != nil {
			return err
		}
		if a.Seal != nil {
			return a.Seal(ctx, c, tx)
		}
		return nil
	})
	if replay != nil {
		if err == nil {
			err = s.start(ctx, c, a)
		}
		return replay, err
	}
	if err == nil {
		return out, s.start(ctx, c, a)
	}
	if a.Failed != nil {
		if ferr := s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return a.Failed(ctx, c, tx, err) }); ferr != nil {
			s.deps.Logger.Error("recording a refused admission", "resource", c.Resource.String(), "error", ferr)
		}
	}
	return out, err
}

// decideAdmission refreshes the draft, so the decision never reads a stale
// copy, makes the one Require on it, then requires the admission's further
// decisions (Also) for the same caller, still outside any transaction.
func (s *Server) decideAdmission(ctx context.Context, c *Call, a *rpc.ErasedAdmission) error {
	if r, ok := s.iam.(iam.Refresher); ok {
		if err := r.RefreshResource(ctx, c.DecisionTenant, c.Resource); err != nil {
			return core.Wrap(core.CodeUnavailable, err, "could not refresh the draft before deciding")
		}
	}
	if err := s.iam.Require(ctx, c.Request(c.Resource)); err != nil {
		return err
	}
	if a.Also == nil {
		return nil
	}
	for _, r := range a.Also(c) {
		req := c.Request(r.Resource)
		req.Action = r.Action
		if err := s.iam.Require(ctx, req); err != nil {
			return err
		}
	}
	return nil
}

// completedResult reads the stored result of a completed admission.
func (s *Server) completedResult(ctx context.Context, key idempotencyKey) (json.RawMessage, bool) {
	var row idempotencyRow
	err := s.store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		row, _, err = key.read(ctx, tx, "")
		return err
	})
	return row.result, err == nil && row.result != nil
}

// start runs the admission's started hook; a failure is UNAVAILABLE, which
// the caller retries with the same key (the replay starts it again).
func (s *Server) start(ctx context.Context, c *Call, a *rpc.ErasedAdmission) error {
	if a.Started == nil {
		return nil
	}
	if err := a.Started(ctx, c); err != nil {
		return core.Wrap(core.CodeUnavailable, err, "admitted, but its workflow could not be started; retry with the same idempotencyKey")
	}
	return nil
}

// requestHash is the SHA-256 of the input re-encoded canonically (object keys
// sorted), so a retry with the same fields in another order still matches.
func requestHash(input json.RawMessage) ([]byte, error) {
	var v any
	if err := json.Unmarshal(input, &v); err != nil {
		return nil, core.Errorf(core.CodeInvalidInput, "input must be a JSON object")
	}
	canonical, err := json.Marshal(v) // encoding/json sorts map keys
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(canonical)
	return sum[:], nil
}

type idempotencyKey struct{ tenant, identity, method, key string }

type idempotencyRow struct {
	hash     []byte
	resource iam.Resource
	result   json.RawMessage
}

// serialize takes a transaction-scoped advisory lock on the key: a row
// lock cannot queue callers before the row exists. The lock's 64-bit id is
// a hash of the key's parts, encoded unambiguously; a collision only makes
// two keys wait for each other.
func (k idempotencyKey) serialize(ctx context.Context, tx store.Tx) error {
	parts, err := json.Marshal([]string{k.tenant, k.identity, k.method, k.key})
	if err != nil {
		return fmt.Errorf("idempotency lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, string(parts)); err != nil {
		return fmt.Errorf("idempotency lock: %w", err)
	}
	return nil
}

func (k idempotencyKey) lock(ctx context.Context, tx store.Tx) (idempotencyRow, bool, error) {
	return k.read(ctx, tx, " FOR UPDATE")
}

func (k idempotencyKey) read(ctx context.Context, tx store.Tx, locking string) (idempotencyRow, bool, error) {
	var r idempotencyRow
	err := tx.QueryRow(ctx, `SELECT request_hash, resource_type, resource_id, result FROM idempotency_keys
		WHERE tenant_id = $1 AND identity_id = $2 AND method = $3 AND key = $4`+locking,
		k.tenant, k.identity, k.method, k.key).Scan(&r.hash, &r.resource.Type, &r.resource.ID, &r.result)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	return r, err == nil, err
}

func (k idempotencyKey) insert(ctx context.Context, tx store.Tx, hash []byte, r iam.Resource) error {
	_, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, identity_id, method, key, request_hash, resource_type, resource_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, k.tenant, k.identity, k.method, k.key, hash, r.Type, r.ID)
	return err
}

// complete stores the result and returns it as a replay reads it back.
func (k idempotencyKey) complete(ctx context.Context, tx store.Tx, result any) (json.RawMessage, error) {
	raw, err := json.Marshal(result)
	if err != nil {
		return nil, fmt.Errorf("admission result: %w", err)
	}
	var stored json.RawMessage
	err = tx.QueryRow(ctx, `UPDATE idempotency_keys SET result = $5, completed_at = now()
		WHERE tenant_id = $1 AND identity_id = $2 AND method = $3 AND key = $4 RETURNING result`,
		k.tenant, k.identity, k.method, k.key, raw).Scan(&stored)
	if err != nil {
		return nil, fmt.Errorf("admission result: %w", err)
	}
	return stored, nil
}
