package nodes

import (
	"context"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/store"
)

// specSSH reads the sshd section of the node's NodeSpec: the certificate
// authorities its sshd trusts and the revoked keys.
func specSSH(ctx context.Context, db store.DBTX, nodeID string) (*nodespec.SSH, error) {
	return nil, nil
}
