package iam

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// The audit chain: one per tenant, append-only, hash-chained. Each entry's
// hash is SHA-256(prev_hash || canonical JSON of the entry), the first
// entry's prev_hash being 32 zero bytes. Appends lock the tenant's head row
// (iam_audit_heads) FOR UPDATE, so a tenant's entries get consecutive seq
// numbers in commit order; a trigger makes UPDATE, DELETE and TRUNCATE of
// iam_audit_entries fail.
//
// The canonical JSON of an entry is the object of every field of AuditEntry
// but prevHash and hash, keys sorted, no insignificant white space, at as
// epoch milliseconds, details an object of strings (empty: {}), encoded by
// encoding/json without HTML escaping.

// Audit entry kinds.
const (
	AuditKindDecision = "decision" // an IAM decision: every denial, every ROOT_OVERRIDE
	AuditKindAdmin    = "admin"    // a change made through Admin, or a refused admin call
)

// AuditEntry is one entry of a tenant's audit chain.
type AuditEntry struct {
	TenantID       string            `json:"tenantId"`
	Seq            int64             `json:"seq"`
	ID             string            `json:"id"`
	At             int64             `json:"at"` // epoch ms
	Kind           string            `json:"kind"`
	IdentityID     string            `json:"identityId"`
	SessionID      string            `json:"sessionId"`
	Action         string            `json:"action"`
	ResourceType   string            `json:"resourceType"`
	ResourceID     string            `json:"resourceId"`
	Allowed        bool              `json:"allowed"`
	Reason         string            `json:"reason"`
	RequestID      string            `json:"requestId"`
	TargetTenantID string            `json:"targetTenantId"` // the tenant a TENANT_MISMATCH or ROOT_OVERRIDE aimed at
	Details        map[string]string `json:"details"`
	PrevHash       string            `json:"prevHash"` // hex
	Hash           string            `json:"hash"`     // hex
}

// AuditVerification is the result of recomputing a tenant's chain.
type AuditVerification struct {
	TenantID string `json:"tenantId"`
	OK       bool   `json:"ok"`
	Entries  int64  `json:"entries"`
	// BrokenAt is the seq of the first entry that does not verify (0 when
	// OK, or when only the head disagrees with the last entry).
	BrokenAt int64  `json:"brokenAt,omitempty"`
	Problem  string `json:"problem,omitempty"`
}

// auditRecord is what an append is given: an entry without its chain fields.
type auditRecord struct {
	tenantID       string
	kind           string
	identityID     string
	sessionID      string
	action         string
	resourceType   string
	resourceID     string
	allowed        bool
	reason         string
	requestID      string
	targetTenantID string
	details        map[string]string
}

// auditGenesis is the prev_hash of a chain's first entry: 32 zero bytes.
func auditGenesis() []byte { return make([]byte, sha256.Size) }

// errAuditDetails: a stored entry's details are not an object of strings.
var errAuditDetails = errors.New("details are not an object of strings")

// auditCanonical is the canonical JSON of e (see the package comment above).
func auditCanonical(e *AuditEntry) ([]byte, error) {
	details := e.Details
	if details == nil {
		details = map[string]string{}
	}
	m := map[string]any{
		"tenantId": e.TenantID, "seq": e.Seq, "id": e.ID, "at": e.At, "kind": e.Kind,
		"identityId": e.IdentityID, "sessionId": e.SessionID, "action": e.Action,
		"resourceType": e.ResourceType, "resourceId": e.ResourceID, "allowed": e.Allowed,
		"reason": e.Reason, "requestId": e.RequestID, "targetTenantId": e.TargetTenantID,
		"details": details,
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// auditHash is SHA-256(prev || canonical JSON of e).
func auditHash(prev []byte, e *AuditEntry) ([]byte, error) {
	body, err := auditCanonical(e)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write(prev)
	h.Write(body)
	return h.Sum(nil), nil
}

// auditAppend appends records to their tenants' chains inside tx. Tenants
// are locked in sorted order, so concurrent multi-tenant appends (a
// ROOT_OVERRIDE audits two chains) cannot deadlock.
func auditAppend(ctx context.Context, tx store.Tx, now time.Time, recs []auditRecord) error {
	byTenant := map[string][]auditRecord{}
	for _, r := range recs {
		byTenant[r.tenantID] = append(byTenant[r.tenantID], r)
	}
	tenants := make([]string, 0, len(byTenant))
	for t := range byTenant {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	at := now.UnixMilli()
	for _, tenant := range tenants {
		seq, prev, err := auditLockHead(ctx, tx, tenant)
		if err != nil {
			return err
		}
		batch := &pgx.Batch{}
		for _, r := range byTenant[tenant] {
			seq++
			e := AuditEntry{
				TenantID: tenant, Seq: seq, ID: core.NewID("aud"), At: at, Kind: r.kind,
				IdentityID: r.identityID, SessionID: r.sessionID, Action: r.action,
				ResourceType: r.resourceType, ResourceID: r.resourceID, Allowed: r.allowed,
				Reason: r.reason, RequestID: r.requestID, TargetTenantID: r.targetTenantID, Details: r.details,
			}
			if e.Details == nil {
				e.Details = map[string]string{}
			}
			hash, err := auditHash(prev, &e)
			if err != nil {
				return fmt.Errorf("audit: hash: %w", err)
			}
			details, err := json.Marshal(e.Details)
			if err != nil {
				return fmt.Errorf("audit: details: %w", err)
			}
			batch.Queue(`INSERT INTO iam_audit_entries (tenant_id, seq, id, at, kind, identity_id, session_id,
				action, resource_type, resource_id, allowed, reason, request_id, target_tenant_id, details,
				prev_hash, hash) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17)`,
				e.TenantID, e.Seq, e.ID, time.UnixMilli(e.At), e.Kind, e.IdentityID, e.SessionID,
				e.Action, e.ResourceType, e.ResourceID, e.Allowed, e.Reason, e.RequestID, e.TargetTenantID,
				details, prev, hash)
			prev = hash
		}
		batch.Queue(`UPDATE iam_audit_heads SET seq = $2, hash = $3 WHERE tenant_id = $1`, tenant, seq, prev)
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			return fmt.Errorf("audit: append: %w", err)
		}
	}
	return nil
}

// auditLockHead locks a tenant's head row, making it on the chain's first
// append, and returns the last seq and hash.
func auditLockHead(ctx context.Context, tx store.Tx, tenant string) (int64, []byte, error) {
	var seq int64
	var hash []byte
	const lock = `SELECT seq, hash FROM iam_audit_heads WHERE tenant_id = $1 FOR UPDATE`
	err := tx.QueryRow(ctx, lock, tenant).Scan(&seq, &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := tx.Exec(ctx, `INSERT INTO iam_audit_heads (tenant_id, seq, hash) VALUES ($1, 0, $2)
			ON CONFLICT (tenant_id) DO NOTHING`, tenant, auditGenesis()); err != nil {
			return 0, nil, fmt.Errorf("audit: head: %w", err)
		}
		err = tx.QueryRow(ctx, lock, tenant).Scan(&seq, &hash)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("audit: lock head: %w", err)
	}
	return seq, hash, nil
}

const auditColumns = `tenant_id, seq, id, at, kind, identity_id, session_id, action, resource_type,
	resource_id, allowed, reason, request_id, target_tenant_id, details, prev_hash, hash`

// auditScan reads one row of auditColumns; prev and hash come back raw too.
func auditScan(row pgx.Row) (AuditEntry, []byte, []byte, error) {
	var e AuditEntry
	var at time.Time
	var details, prev, hash []byte
	if err := row.Scan(&e.TenantID, &e.Seq, &e.ID, &at, &e.Kind, &e.IdentityID, &e.SessionID, &e.Action,
		&e.ResourceType, &e.ResourceID, &e.Allowed, &e.Reason, &e.RequestID, &e.TargetTenantID, &details,
		&prev, &hash); err != nil {
		return e, nil, nil, err
	}
	e.At = at.UnixMilli()
	e.Details = map[string]string{}
	if err := json.Unmarshal(details, &e.Details); err != nil {
		return e, nil, nil, fmt.Errorf("audit entry %d: %w: %v", e.Seq, errAuditDetails, err)
	}
	e.PrevHash, e.Hash = hex.EncodeToString(prev), hex.EncodeToString(hash)
	return e, prev, hash, nil
}

// auditEntries reads a tenant's entries after seq afterSeq, oldest first.
func auditEntries(ctx context.Context, db *store.Store, tenantID string, afterSeq int64, limit int) ([]AuditEntry, error) {
	rows, err := db.Pool.Query(ctx, `SELECT `+auditColumns+` FROM iam_audit_entries
		WHERE tenant_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`, tenantID, afterSeq, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []AuditEntry{}
	for rows.Next() {
		e, _, _, err := auditScan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// VerifyAuditChain recomputes a tenant's chain from its first entry: seq
// numbers consecutive from 1, each prev_hash the previous entry's hash, each
// hash SHA-256(prev_hash || canonical JSON) of the stored columns, and the
// head equal to the last entry. A tenant with no chain verifies, empty.
func VerifyAuditChain(ctx context.Context, db *store.Store, tenantID string) (AuditVerification, error) {
	v := AuditVerification{TenantID: tenantID}
	err := db.InTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx store.Tx) error {
		var headSeq int64
		var headHash []byte
		err := tx.QueryRow(ctx, `SELECT seq, hash FROM iam_audit_heads WHERE tenant_id = $1`, tenantID).
			Scan(&headSeq, &headHash)
		if errors.Is(err, pgx.ErrNoRows) {
			headHash = auditGenesis()
		} else if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT `+auditColumns+` FROM iam_audit_entries WHERE tenant_id = $1 ORDER BY seq`, tenantID)
		if err != nil {
			return err
		}
		defer rows.Close()
		prev := auditGenesis()
		for rows.Next() {
			e, storedPrev, storedHash, err := auditScan(rows)
			v.Entries++
			if errors.Is(err, errAuditDetails) {
				v.BrokenAt, v.Problem = e.Seq, errAuditDetails.Error()
				return nil
			}
			if err != nil {
				return err
			}
			fail := func(problem string) {
				v.BrokenAt, v.Problem = e.Seq, problem
			}
			switch {
			case e.Seq != v.Entries:
				fail(fmt.Sprintf("seq %d where %d was expected (an entry is missing)", e.Seq, v.Entries))
			case !bytes.Equal(storedPrev, prev):
				fail("prev_hash is not the previous entry's hash")
			default:
				want, err := auditHash(prev, &e)
				if err != nil {
					return err
				}
				if !bytes.Equal(want, storedHash) {
					fail("the hash does not match the entry's content")
				}
			}
			if v.Problem != "" {
				return nil
			}
			prev = storedHash
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if headSeq != v.Entries || !bytes.Equal(headHash, prev) {
			v.Problem = fmt.Sprintf("the head (seq %d) does not match the last entry (seq %d)", headSeq, v.Entries)
			return nil
		}
		v.OK = true
		return nil
	})
	if err != nil {
		return AuditVerification{}, fmt.Errorf("audit: verify %s: %w", tenantID, err)
	}
	return v, nil
}
