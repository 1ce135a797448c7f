package nodes

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/store"
)

// specSSH reads the sshd section of the node's NodeSpec: the certificate
// authorities its sshd trusts (its tenant's live SSH user CA), the revoked
// certificates that have not expired yet (sshd's RevokedKeys, a KRL bcd
// builds from them), and for each Unix user with a live certificate on
// the node the one principal that opens it, <user>@<nodeId>. A node whose
// tenant has no CA yet has no section (nil: bcd leaves sshd's files
// alone). The SSH certificates domain (store/sshcerts) writes these rows.
func specSSH(ctx context.Context, db store.DBTX, nodeID string) (*nodespec.SSH, error) {
	var cas, revoked, users []string
	err := db.QueryRow(ctx, `SELECT
		(SELECT coalesce(array_agg(a.public_key ORDER BY a.created_at, a.id), '{}') FROM ssh_cas a JOIN nodes n ON n.tenant_id = a.tenant_id
			WHERE n.id = $1 AND a.retired_at IS NULL),
		(SELECT coalesce(array_agg(c.certificate ORDER BY c.ca_id, c.serial), '{}') FROM ssh_certificates c
			WHERE c.node_id = $1 AND c.revoked_at IS NOT NULL AND c.valid_before > now()),
		(SELECT coalesce(array_agg(DISTINCT u ORDER BY u), '{}') FROM ssh_certificates c, unnest(c.users) u
			WHERE c.node_id = $1 AND c.revoked_at IS NULL AND c.valid_before > now())`, nodeID).Scan(&cas, &revoked, &users)
	if err != nil {
		return nil, fmt.Errorf("node %s: sshd trust: %w", nodeID, err)
	}
	if len(cas) == 0 {
		return nil, nil
	}
	principals := make(map[string][]string, len(users))
	for _, u := range users {
		principals[u] = []string{u + "@" + nodeID}
	}
	return &nodespec.SSH{TrustedUserCAKeys: cas, RevokedKeys: revoked, AuthorizedPrincipals: principals}, nil
}
