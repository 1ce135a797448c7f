package nodes

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/store"
)

// specVolumes reads the volumes section of the node's NodeSpec: the
// sandbox volumes kept on the node (store/sandboxes writes them) that
// are not being deleted, and sets each listed instance's mounts (copied
// onto its row when it was placed). A deleted volume leaves the list; the
// agent removes it once no instance mounts it.
func specVolumes(ctx context.Context, db store.DBTX, nodeID string, spec *nodespec.Spec) error {
	rows, err := db.Query(ctx, `SELECT id, size_gib FROM sandbox_volumes
		WHERE node_id = $1 AND state IN ('creating', 'resizing', 'ready') ORDER BY id`, nodeID)
	if err != nil {
		return err
	}
	if spec.Volumes, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (nodespec.Volume, error) {
		var v nodespec.Volume
		return v, r.Scan(&v.ID, &v.SizeGiB)
	}); err != nil {
		return err
	}
	if len(spec.Volumes) == 0 {
		spec.Volumes = nil
	}
	if len(spec.Instances) == 0 {
		return nil
	}
	rows, err = db.Query(ctx, `SELECT id, mounts FROM instances WHERE node_id = $1 AND mounts <> '[]'::jsonb`, nodeID)
	if err != nil {
		return err
	}
	mounts := map[string][]nodespec.Mount{}
	var id string
	var raw []byte
	if _, err := pgx.ForEachRow(rows, []any{&id, &raw}, func() error {
		var m []nodespec.Mount
		if err := json.Unmarshal(raw, &m); err != nil {
			return err
		}
		mounts[id] = m
		return nil
	}); err != nil {
		return err
	}
	for i := range spec.Instances {
		spec.Instances[i].Mounts = mounts[spec.Instances[i].ID]
	}
	return nil
}
