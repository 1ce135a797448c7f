package nodes

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/store"
)

// specInstances reads the instances section of the node's NodeSpec: every
// instance placed on the node that is not deleted (an instance being
// deleted leaves the list, so the agent removes it), with its flavor's
// limits, its image and its allocation's GPU devices, the sandbox
// snapshot it is restored from and those its node is asked to take
// (sandbox_snapshots, store/sandboxes'). The instances
// table is store/instances'; the NodeSpec reads it here, as it reads the
// node's other sections.
func specInstances(ctx context.Context, db store.DBTX, nodeID string) ([]nodespec.Instance, error) {
	rows, err := db.Query(ctx, `SELECT i.id, i.generation, CASE WHEN i.runtime <> '' THEN i.runtime ELSE f.runtime END, i.desired_state, f.vcpu, f.memory_mib, f.disk_gib,
			im.id, im.format, im.sha256, im.size_bytes,
			COALESCE((SELECT a.atoms FROM allocations a WHERE a.instance_id = i.id AND a.released_at IS NULL), '{}'),
			i.command, (i.user_data IS NOT NULL OR i.user_data_ref IS NOT NULL), i.env <> '{}'::jsonb,
			COALESCE(rs.id, ''), COALESCE(rs.sha256, ''), COALESCE(rs.size_bytes, 0), COALESCE(rs.include_memory, false),
			COALESCE((SELECT json_agg(json_build_object('id', ss.id, 'memory', ss.include_memory) ORDER BY ss.created_at, ss.id)
				FROM sandbox_snapshots ss WHERE ss.instance_id = i.id AND ss.state = 'creating'), '[]')
		FROM instances i JOIN flavors f ON f.id = i.flavor_id JOIN images im ON im.id = i.image_id
			LEFT JOIN sandbox_snapshots rs ON rs.id = i.restore_snapshot_id
		WHERE i.node_id = $1 AND i.state NOT IN ('draft', 'denied', 'deleted', 'deleting') AND i.desired_state <> 'deleted'
		ORDER BY i.id`, nodeID)
	if err != nil {
		return nil, err
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (nodespec.Instance, error) {
		var in nodespec.Instance
		var restore nodespec.InstanceRestore
		var snapshots []byte
		err := r.Scan(&in.ID, &in.Generation, &in.Runtime, &in.Desired, &in.VCPU, &in.MemoryMiB, &in.DiskGiB,
			&in.Image.ID, &in.Image.Format, &in.Image.SHA256, &in.Image.SizeBytes, &in.Devices, &in.Command, &in.UserData, &in.Env,
			&restore.SnapshotID, &restore.SHA256, &restore.SizeBytes, &restore.Memory, &snapshots)
		if err != nil {
			return in, err
		}
		if restore.SnapshotID != "" {
			in.Restore = &restore
		}
		if err := json.Unmarshal(snapshots, &in.Snapshots); err != nil {
			return in, err
		}
		if len(in.Snapshots) == 0 {
			in.Snapshots = nil
		}
		if len(in.Devices) == 0 {
			in.Devices = nil
		}
		if len(in.Command) == 0 {
			in.Command = nil
		}
		return in, err
	})
	if len(list) == 0 {
		return nil, err
	}
	return list, err
}
