package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/batches"
	"github.com/better-compute/better-compute/api/nodes"
	corebatches "github.com/better-compute/better-compute/core/batches"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/sshsigtest"
	"github.com/better-compute/better-compute/internal/testutil"
)

// iamAdmin calls a method of the IAM admin surface over HTTP as the
// platform's operator, into out.
func iamAdmin(t *testing.T, apiURL, token, method string, in, out any) {
	t.Helper()
	body, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, apiURL+iam.AdminPathPrefix+method, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&e)
		t.Fatalf("iam %s: %d %v", method, resp.StatusCode, e)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}

// runApprovedBatch has the operator register an approver (an identity, a
// policy letting its group approve, a token, a key, all on the IAM admin
// surface), create a destructive batch over nodeIDs of the root tenant,
// and the approver approve it: the real agents run the exec, and its
// output comes back per node.
func runApprovedBatch(ctx context.Context, t *testing.T, apiURL, adminToken string, nodeIDs []string) {
	const root, group = "root", "batch-approvers"
	var idn iam.Identity
	iamAdmin(t, apiURL, adminToken, "createIdentity", iam.CreateIdentityInput{TenantID: root, Kind: iam.KindPerson,
		Name: "approver-e2e", Groups: []string{group}}, &idn)
	var pol iam.Policy
	iamAdmin(t, apiURL, adminToken, "putPolicy", iam.PutPolicyInput{TenantID: root, Name: group, Cedar: iam.TenantAdminsPolicy(group)}, &pol)
	var tok iam.CreatedToken
	iamAdmin(t, apiURL, adminToken, "createToken", iam.CreateTokenInput{TenantID: root, IdentityID: idn.ID, SessionKind: iam.SessionUser}, &tok)
	key := sshsigtest.NewKey(t, "approver@e2e")
	var k iam.ApproverKey
	iamAdmin(t, apiURL, adminToken, "addApproverKey", iam.AddApproverKeyInput{TenantID: root, IdentityID: idn.ID, PublicKey: key.AuthorizedKey}, &k)

	admin := api.NewClient(apiURL, adminToken)
	one := 1
	began := time.Now()
	b, err := batches.Create.Call(ctx, admin, batches.CreateInput{TenantID: root, Description: "e2e",
		Commands:  []batches.CommandInput{{Kind: "exec", Args: json.RawMessage(`{"argv":["sh","-c","echo batch-ran"]}`)}},
		Selection: batches.Selection{NodeIDs: nodeIDs}, Quorum: &one, Concurrency: 1})
	if err != nil || b.State != "awaitingApproval" || b.Waves != len(nodeIDs) {
		t.Fatalf("create = %+v, %v", b, err)
	}
	if _, err := batches.Approve.Call(ctx, api.NewClient(apiURL, tok.Token), batches.ApproveInput{TenantID: root, BatchID: b.ID,
		Digest: b.Digest, Signature: key.SignBytes(t, corebatches.SignatureNamespace, []byte(b.Digest))}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyNil(t, 2*time.Minute, func() error {
		if b, err = batches.Get.Call(ctx, admin, batches.BatchInput{TenantID: root, BatchID: b.ID}); err != nil || b.State != "succeeded" {
			return fmt.Errorf("batch %s %v: %v", b.State, b.Counts, err)
		}
		return nil
	})
	t.Logf("command batch over %d nodes (one per wave) succeeded %v after its create", len(nodeIDs), time.Since(began).Round(time.Millisecond))
	for _, n := range b.Nodes {
		c, err := nodes.GetCommand.Call(ctx, admin, nodes.CommandInput{TenantID: root, NodeID: n.NodeID, CommandID: n.Results[0].CommandID})
		if err != nil || c.Stdout != "batch-ran\n" || c.ExitCode == nil || *c.ExitCode != 0 {
			t.Fatalf("node %s: %+v, %v", n.NodeID, c, err)
		}
	}
}
