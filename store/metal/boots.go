package metal

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
)

// Boot purposes (metal_boots.purpose).
const (
	PurposeInspect = "inspect"
	PurposeClean   = "clean"
	PurposeDeploy  = "deploy"
	PurposeRescue  = "rescue"
)

// Boot is one boot of a node into the ramdisk (a metal_boots row), without
// its token.
type Boot struct {
	ID          string
	NodeID      string
	TenantID    string
	SiteID      string
	OpSeq       int64
	Purpose     string
	TokenIssued bool
	ExpiresAt   time.Time
	ReportedAt  *time.Time
	Inventory   json.RawMessage
	HardwareKey string
	Steps       []protocol.RamdiskStep
	Results     []protocol.RamdiskStepResult
	FinishedAt  *time.Time
	// JoinedAt is when the installed system's agent first joined with the
	// boot's token; JoinError why a join with it was refused.
	JoinedAt  *time.Time
	JoinError string
}

const bootSelect = `SELECT id, node_id, tenant_id, site_id, op_seq, purpose, token_hash IS NOT NULL, expires_at, reported_at,
	inventory, hardware_key, steps, results, finished_at, joined_at, join_error FROM metal_boots`

func scanBoot(row pgx.Row) (Boot, error) {
	var b Boot
	var inv, steps, results []byte
	err := row.Scan(&b.ID, &b.NodeID, &b.TenantID, &b.SiteID, &b.OpSeq, &b.Purpose, &b.TokenIssued, &b.ExpiresAt, &b.ReportedAt,
		&inv, &b.HardwareKey, &steps, &results, &b.FinishedAt, &b.JoinedAt, &b.JoinError)
	if err != nil {
		return Boot{}, err
	}
	if len(inv) > 0 {
		b.Inventory = inv
	}
	if err := json.Unmarshal(steps, &b.Steps); err != nil {
		return Boot{}, err
	}
	return b, json.Unmarshal(results, &b.Results)
}

func bootNotFound(id string) error { return core.Errorf(core.CodeNotFound, "boot %s not found", id) }

// CreateBoot records the boot of the node for operation opSeq (fenced)
// with its purpose, valid until the operation's deadline, or answers the
// one it already has (a retried step finds its boot); its token is minted
// later, once, for the site agent that serves it.
func CreateBoot(ctx context.Context, tx store.Tx, nodeID string, opSeq int64, purpose string) (Boot, error) {
	o, err := fence(ctx, tx, nodeID, opSeq)
	if err != nil {
		return Boot{}, err
	}
	b, err := scanBoot(tx.QueryRow(ctx, bootSelect+` WHERE node_id = $1 AND op_seq = $2 AND purpose = $3`, nodeID, opSeq, purpose))
	if err == nil || !errors.Is(err, pgx.ErrNoRows) {
		return b, err
	}
	id := core.NewID("boot")
	if _, err := tx.Exec(ctx, `INSERT INTO metal_boots (id, node_id, tenant_id, site_id, op_seq, purpose, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, id, nodeID, o.TenantID, o.SiteID, opSeq, purpose, o.Deadline); err != nil {
		return Boot{}, err
	}
	return GetBoot(ctx, tx, id)
}

// GetBoot reads a boot.
func GetBoot(ctx context.Context, tx store.Tx, id string) (Boot, error) {
	b, err := scanBoot(tx.QueryRow(ctx, bootSelect+` WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Boot{}, bootNotFound(id)
	}
	return b, err
}

// SetBootSteps sets the steps the ramdisk of the boot is answered next
// (none: it waits), for operation opSeq (fenced).
func SetBootSteps(ctx context.Context, tx store.Tx, bootID string, opSeq int64, steps []protocol.RamdiskStep) error {
	b, err := GetBoot(ctx, tx, bootID)
	if err != nil {
		return err
	}
	if _, err := fence(ctx, tx, b.NodeID, opSeq); err != nil {
		return err
	}
	if b.OpSeq != opSeq {
		return Superseded(b.NodeID, opSeq)
	}
	if steps == nil {
		steps = []protocol.RamdiskStep{}
	}
	raw, err := json.Marshal(steps)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE metal_boots SET steps = $2, results = '[]' WHERE id = $1`, bootID, string(raw))
	return err
}

// FinishBoot ends a boot: its token is refused from then on.
func FinishBoot(ctx context.Context, tx store.Tx, bootID string) error {
	_, err := tx.Exec(ctx, `UPDATE metal_boots SET finished_at = COALESCE(finished_at, now()) WHERE id = $1`, bootID)
	return err
}

// IngestInspection ingests the inventory the boot's ramdisk reported into
// the node (store/nodes.Ingest: snapshot, devices, hardware key) for
// operation opSeq (fenced). A hardware key another live node already has
// is CONFLICT naming that node, and nothing is merged.
func IngestInspection(ctx context.Context, tx store.Tx, t nodes.Types, bootID string, opSeq int64) (nodes.IngestResult, error) {
	b, err := GetBoot(ctx, tx, bootID)
	if err != nil {
		return nodes.IngestResult{}, err
	}
	if _, err := fence(ctx, tx, b.NodeID, opSeq); err != nil {
		return nodes.IngestResult{}, err
	}
	if b.ReportedAt == nil || len(b.Inventory) == 0 {
		return nodes.IngestResult{}, core.Errorf(core.CodeInvalidState, "boot %s has not reported an inventory", bootID)
	}
	if other, err := nodes.HardwareKeyOwner(ctx, tx, b.HardwareKey, b.NodeID); err != nil || other != "" {
		if err != nil {
			return nodes.IngestResult{}, err
		}
		return nodes.IngestResult{}, HardwareKeyConflict(other)
	}
	res, err := nodes.Ingest(ctx, tx, t, b.NodeID, b.Inventory)
	if err != nil {
		return nodes.IngestResult{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE node_metal SET inspected_at = now(), updated_at = now() WHERE node_id = $1`, b.NodeID); err != nil {
		return nodes.IngestResult{}, err
	}
	return res, nodes.AddEvent(ctx, tx, b.NodeID, EventInspected, "inventory ingested from boot "+bootID,
		map[string]any{"bootId": bootID, "opSeq": opSeq, "hardwareKey": res.HardwareKey.Key})
}

// HardwareKeyConflict is the CONFLICT of a machine whose hardware key is
// node other's.
func HardwareKeyConflict(other string) error {
	return core.Errorf(core.CodeConflict, "the machine's hardware key is node %s's", other).
		WithDetails(map[string]any{"reason": coremetal.ReasonHardwareConflict, "nodeId": other})
}

// ConflictingNode is the node a HardwareKeyConflict names ("" for any other
// error).
func ConflictingNode(err error) string {
	var e *core.Error
	if errors.As(err, &e) && e.Code == core.CodeConflict && e.Details["reason"] == coremetal.ReasonHardwareConflict {
		id, _ := e.Details["nodeId"].(string)
		return id
	}
	return ""
}

// RejoinMatches reports whether the hardware key the boot's ramdisk
// reported is the node's (a deploy re-join is the same machine); a
// mismatch is the workflow's failure hardwareKeyMismatch.
func RejoinMatches(ctx context.Context, tx store.Tx, bootID string) (match bool, want, got string, err error) {
	b, err := GetBoot(ctx, tx, bootID)
	if err != nil {
		return false, "", "", err
	}
	if err := tx.QueryRow(ctx, `SELECT hardware_key FROM nodes WHERE id = $1`, b.NodeID).Scan(&want); err != nil {
		return false, "", "", err
	}
	return b.ReportedAt != nil && want != "" && want == b.HardwareKey, want, b.HardwareKey, nil
}

// HashToken is a metal token's stored form, its SHA-256.
func HashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// newToken is prefix and 32 random bytes, base64url.
func newToken(prefix string) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b), nil
}

// MintBootToken mints the token of a boot of a node of siteID, once: a
// boot of another site is NOT_FOUND, a second mint CONFLICT, a finished or
// expired boot INVALID_STATE. The answer is the only place the token is
// ever in clear.
func MintBootToken(ctx context.Context, tx store.Tx, siteID, bootID string) (protocol.SiteBootTokenResult, error) {
	b, err := scanBoot(tx.QueryRow(ctx, bootSelect+` WHERE id = $1 AND site_id = $2 FOR UPDATE`, bootID, siteID))
	if errors.Is(err, pgx.ErrNoRows) {
		return protocol.SiteBootTokenResult{}, bootNotFound(bootID)
	}
	if err != nil {
		return protocol.SiteBootTokenResult{}, err
	}
	if b.TokenIssued {
		return protocol.SiteBootTokenResult{}, core.Errorf(core.CodeConflict, "boot %s's token was already minted", bootID).
			WithDetails(map[string]any{"reason": "tokenMinted"})
	}
	if b.FinishedAt != nil || !b.ExpiresAt.After(time.Now()) {
		return protocol.SiteBootTokenResult{}, core.Errorf(core.CodeInvalidState, "boot %s has ended", bootID).
			WithDetails(map[string]any{"reason": "bootEnded"})
	}
	token, err := newToken(protocol.BootTokenPrefix)
	if err != nil {
		return protocol.SiteBootTokenResult{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE metal_boots SET token_hash = $2, token_issued_at = now() WHERE id = $1`, bootID, HashToken(token)); err != nil {
		return protocol.SiteBootTokenResult{}, err
	}
	return protocol.SiteBootTokenResult{BootID: b.ID, NodeID: b.NodeID, Purpose: b.Purpose, Token: token,
		ExpiresAt: b.ExpiresAt.UnixMilli()}, nil
}

// ErrBootEnded is a known boot token whose boot finished or expired.
var ErrBootEnded = errors.New("the boot has ended")

// unknownToken is the one answer for a token nobody minted.
func unknownToken() error { return core.Errorf(core.CodeUnauthn, "unknown token") }

// bootByToken reads and locks the boot a token names: an unknown token is
// UNAUTHENTICATED, a finished or expired boot ErrBootEnded.
func bootByToken(ctx context.Context, tx store.Tx, token string) (Boot, error) {
	if len(token) <= len(protocol.BootTokenPrefix) || token[:len(protocol.BootTokenPrefix)] != protocol.BootTokenPrefix {
		return Boot{}, unknownToken()
	}
	b, err := scanBoot(tx.QueryRow(ctx, bootSelect+` WHERE token_hash = $1 FOR UPDATE`, HashToken(token)))
	if errors.Is(err, pgx.ErrNoRows) {
		return Boot{}, unknownToken()
	}
	if err != nil {
		return Boot{}, err
	}
	if b.FinishedAt != nil || !b.ExpiresAt.After(time.Now()) {
		return Boot{}, ErrBootEnded
	}
	return b, nil
}

// BootOfToken reads and locks the boot a ramdisk's token names (the seed
// endpoint's): an unknown token is UNAUTHENTICATED, a finished or expired
// boot ErrBootEnded.
func BootOfToken(ctx context.Context, tx store.Tx, token string) (Boot, error) {
	return bootByToken(ctx, tx, token)
}

// Report stores the inventory a boot's ramdisk reported (and its hardware
// key) on the boot row and answers the steps the workflow set for it (none
// yet: the ramdisk asks again). The node's own inventory is ingested by
// the workflow's step, not here.
func Report(ctx context.Context, tx store.Tx, token string, doc []byte) (Boot, error) {
	b, err := bootByToken(ctx, tx, token)
	if err != nil {
		return Boot{}, err
	}
	inv, err := inventory.Parse(doc)
	if err != nil {
		return Boot{}, core.Wrap(core.CodeInvalidInput, err, "inventory is not a NodeInventory v1 document").
			WithDetails(map[string]any{"field": "inventory"})
	}
	hk := inventory.ComputeHardwareKey(inv)
	if _, err := tx.Exec(ctx, `UPDATE metal_boots SET inventory = $2, hardware_key = $3, reported_at = now() WHERE id = $1`,
		b.ID, string(doc), hk.Key); err != nil {
		return Boot{}, err
	}
	return GetBoot(ctx, tx, b.ID)
}

// Results stores the results of the steps a boot's ramdisk ran and answers
// the boot (its steps are what is left to run: the workflow sets the next).
func Results(ctx context.Context, tx store.Tx, token string, results []protocol.RamdiskStepResult) (Boot, error) {
	b, err := bootByToken(ctx, tx, token)
	if err != nil {
		return Boot{}, err
	}
	if results == nil {
		results = []protocol.RamdiskStepResult{}
	}
	raw, err := json.Marshal(results)
	if err != nil {
		return Boot{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE metal_boots SET results = $2 WHERE id = $1`, b.ID, string(raw)); err != nil {
		return Boot{}, err
	}
	return GetBoot(ctx, tx, b.ID)
}

// Pending steps a report answers: the steps set and not yet answered by a
// result (all of them until results arrive).
func (b Boot) Pending() []protocol.RamdiskStep {
	if len(b.Results) >= len(b.Steps) {
		return []protocol.RamdiskStep{}
	}
	return b.Steps[len(b.Results):]
}

// ErrJoinRefused wraps a join with a boot token that was refused and
// recorded on the boot (metal_boots.join_error): the caller commits the
// record, then answers the error.
var ErrJoinRefused = errors.New("the join with the boot's token was refused")

// JoinWithBoot checks a join that presents a boot token: the token must be
// an open deploy boot's (anything else reads as an unknown token, so a
// token of another purpose joins nothing), and the joining machine's
// hardware key the boot's node's. A key that differs records the refusal
// on the boot and answers CONFLICT (reason hardwareKeyMismatch) wrapping
// ErrJoinRefused: the caller commits, then answers it. On success it
// answers the boot, locked, for the caller to admit its node and MarkJoined.
func JoinWithBoot(ctx context.Context, tx store.Tx, token, hardwareKey string) (Boot, error) {
	b, err := bootByToken(ctx, tx, token)
	if errors.Is(err, ErrBootEnded) {
		return Boot{}, core.Errorf(core.CodeUnauthn, "the boot token's boot has ended")
	}
	if err != nil {
		return Boot{}, err
	}
	if b.Purpose != PurposeDeploy {
		return Boot{}, unknownToken()
	}
	var want string
	if err := tx.QueryRow(ctx, `SELECT hardware_key FROM nodes WHERE id = $1`, b.NodeID).Scan(&want); err != nil {
		return Boot{}, err
	}
	if want == "" || hardwareKey != want {
		msg := fmt.Sprintf("the machine joined with hardware key %q, not node %s's %q", hardwareKey, b.NodeID, want)
		if _, err := tx.Exec(ctx, `UPDATE metal_boots SET join_error = $2 WHERE id = $1`, b.ID, msg); err != nil {
			return Boot{}, err
		}
		return b, fmt.Errorf("%w: %w", ErrJoinRefused, core.Errorf(core.CodeConflict, "%s", msg).
			WithDetails(map[string]any{"reason": coremetal.ReasonHardwareMismatch, "nodeId": b.NodeID}))
	}
	return b, nil
}

// MarkJoined records the boot's first successful join.
func MarkJoined(ctx context.Context, tx store.Tx, bootID string) error {
	_, err := tx.Exec(ctx, `UPDATE metal_boots SET joined_at = coalesce(joined_at, now()), join_error = '' WHERE id = $1`, bootID)
	return err
}
