package nodes

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
)

// The writes of the nodes row the bare-metal lifecycle (store/metal) makes,
// so this package stays the one writer of the nodes table.

// Events of the bare-metal lifecycle on a node's history.
const (
	// EventProvisionState records a change of the provision state
	// (details: from, to, operation, opSeq, and reason on a failure).
	EventProvisionState = "ProvisionStateChanged"
	// EventPower records a change of the power axis read from the BMC.
	EventPower = "PowerChanged"
)

// SetProvisionState moves the node to state, in the caller's transaction,
// with a ProvisionStateChanged event (message and details are the
// caller's: the operation and why) and the node's projection row (its
// lifecycle attribute). No change writes nothing.
func SetProvisionState(ctx context.Context, tx store.Tx, t Types, nodeID string, state nodestate.ProvisionState,
	message string, details map[string]any) (Node, error) {
	n, err := lockAny(ctx, tx, nodeID)
	if err != nil {
		return Node{}, err
	}
	if n.ProvisionState == string(state) {
		return n, nil
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET provision_state = $2, updated_at = now() WHERE id = $1`, n.ID, string(state)); err != nil {
		return Node{}, err
	}
	d := map[string]any{"from": n.ProvisionState, "to": string(state)}
	for k, v := range details {
		d[k] = v
	}
	if err := AddEvent(ctx, tx, n.ID, EventProvisionState, message, d); err != nil {
		return Node{}, err
	}
	n.ProvisionState = string(state)
	if n, err = Get(ctx, tx, n.TenantID, n.ID, false); err != nil {
		return Node{}, err
	}
	return n, PutAuthz(ctx, tx, t, n)
}

// SetPower records the power state a BMC read back; no change writes
// nothing.
func SetPower(ctx context.Context, tx store.Tx, nodeID string, power nodestate.Power) error {
	var old string
	err := tx.QueryRow(ctx, `SELECT power FROM nodes WHERE id = $1 AND deleted_at IS NULL FOR UPDATE`, nodeID).Scan(&old)
	if errors.Is(err, pgx.ErrNoRows) {
		return NotFound(nodeID)
	}
	if err != nil || old == string(power) {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET power = $2, updated_at = now() WHERE id = $1`, nodeID, string(power)); err != nil {
		return err
	}
	return AddEvent(ctx, tx, nodeID, EventPower, "power "+string(power), map[string]any{"from": old, "to": string(power)})
}

// HardwareKeyOwner is the live node other than nodeID whose hardware key is
// key ("" when none): a machine inspected as another node's hardware is a
// CONFLICT naming that node, before anything is merged.
func HardwareKeyOwner(ctx context.Context, tx store.Tx, key, nodeID string) (string, error) {
	if key == "" {
		return "", nil
	}
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM nodes WHERE hardware_key = $1 AND id <> $2 AND deleted_at IS NULL
		ORDER BY created_at LIMIT 1`, key, nodeID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return id, err
}

// RevokeIdentities revokes the node's identities with an IdentityRevoked
// event saying why (a retired machine keeps no credential).
func RevokeIdentities(ctx context.Context, tx store.Tx, nodeID, reason, by string) (int, error) {
	n, err := RevokeNodeIdentities(ctx, tx, nodeID, by)
	if err != nil {
		return 0, err
	}
	return n, AddEvent(ctx, tx, nodeID, EventIdentityRevoked, "identities revoked: "+reason,
		map[string]any{"by": by, "revoked": n})
}

// InventoryMACs are the MACs (permanent and current) of the NICs in the
// node's newest inventory snapshot, lower-cased; none before its first.
func InventoryMACs(ctx context.Context, tx store.Tx, nodeID string) ([]string, bool, error) {
	rows, err := tx.Query(ctx, `SELECT DISTINCT lower(m) FROM (
			SELECT document FROM node_inventories WHERE node_id = $1 ORDER BY seq DESC LIMIT 1) d,
			jsonb_array_elements(COALESCE(d.document->'nics', '[]')) nic,
			LATERAL (VALUES (nic->>'mac'), (nic->>'permanentMac')) v(m)
		WHERE m IS NOT NULL AND m <> ''`, nodeID)
	macs, err := collectStrings(rows, err)
	if err != nil {
		return nil, false, err
	}
	var has bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM node_inventories WHERE node_id = $1)`, nodeID).Scan(&has); err != nil {
		return nil, false, err
	}
	return macs, has, nil
}
