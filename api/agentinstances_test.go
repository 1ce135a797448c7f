package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/session"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	"github.com/better-compute/better-compute/store/secrets"
)

// The node's side of an instance over the real agent listener: the
// instances frame records its report (fenced by the session), and the
// image and user-data paths answer only the node it is placed on.
func TestAgentInstances(t *testing.T) {
	ctx := context.Background()
	bs, err := blobs.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var vault *secrets.Vault
	ae := newAgentEnv(t, 10*time.Second, "", func(d *agentgateway.Deps) { d.Blobs = bs; vault = testVault(t); d.Secrets = vault })
	body := bytes.Repeat([]byte("disk"), 1024)
	sum := sha256.Sum256(body)
	digest := hex.EncodeToString(sum[:])
	if _, err := bs.Put(ctx, blobs.Key{TenantID: "acme", SHA256: digest}, int64(len(body)), bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	image, flavor := core.NewID("img"), core.NewID("flv")
	ae.exec(`INSERT INTO images (id, tenant_id, name, version, format, sha256, size_bytes, state, created_by)
		VALUES ($1, 'acme', 'debian', '12', 'raw', $2, $3, 'available', 'idn_x')`, image, digest, len(body))
	ae.exec(`INSERT INTO flavors (id, tenant_id, pool_id, name, vcpu, memory_mib, runtime) VALUES ($1, 'acme', $2, 'c', 1, 256, 'container')`,
		flavor, ae.pool.ID)
	if err := ae.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, err := vault.Put(ctx, tx, secrets.PutRequest{TenantID: "acme", Name: "seed", Scope: "tenant", Value: "#cloud-config secret", By: "idn_x"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	withRef, plain, other := core.NewID("inst"), core.NewID("inst"), core.NewID("inst")
	for _, row := range []struct {
		id, node string
		plain    any
		ref      any
	}{{withRef, ae.node.ID, nil, "secret://acme/seed"}, {plain, ae.node.ID, "#cloud-config plain", nil}, {other, "", nil, nil}} {
		var node any
		if row.node != "" {
			node = row.node
		}
		ae.exec(`INSERT INTO instances (id, tenant_id, owner_identity_id, pool_id, flavor_id, image_id, name, desired_state, state,
				node_id, user_data, user_data_ref)
			VALUES ($1, 'acme', 'idn_o', $2, $3, $4, 'i', 'running', 'creating', $5, $6, $7)`,
			row.id, ae.pool.ID, flavor, image, node, row.plain, row.ref)
	}

	// A sandbox workload's environment names the secret beside a plain value.
	ae.exec(`UPDATE instances SET env = '{"SEED": "secret://acme/seed", "MODE": "plain"}' WHERE id IN ($1, $2)`, withRef, other)

	// The report: recorded for the node's instances only; a full one
	// marks the node's unnamed instances gone.
	rs, _ := ae.open(ae.identity)
	rs.send(hello(time.Now()))
	rs.next("welcome")
	rs.send(map[string]any{"type": "instances", "full": true, "statuses": []map[string]any{
		{"id": withRef, "generation": 1, "state": "running", "address": "10.88.0.7", "vcpu": 1, "memoryMiB": 256},
		{"id": other, "generation": 1, "state": "running"}}})
	testutil.EventuallyNil(t, 10*time.Second, func() error {
		var observed, address, gone string
		_ = ae.store.Pool.QueryRow(ctx, `SELECT observed_state, address FROM instances WHERE id = $1`, withRef).Scan(&observed, &address)
		_ = ae.store.Pool.QueryRow(ctx, `SELECT observed_state FROM instances WHERE id = $1`, plain).Scan(&gone)
		if observed != "running" || address != "10.88.0.7" || gone != "gone" {
			return fmt.Errorf("observed %q address %q, the unnamed one %q", observed, address, gone)
		}
		return nil
	})
	if n := ae.count(`SELECT count(*) FROM instances WHERE id = $1 AND observed_state <> ''`, other); n != 0 {
		t.Fatal("another node's instance took the report")
	}

	client := session.NewHTTPClient(ae.identity)
	get := func(path string, header http.Header) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, ae.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	cases := []struct {
		name   string
		path   string
		header http.Header
		status int
		body   string
	}{
		{"image", protocol.InstanceImagePath + withRef, nil, http.StatusOK, string(body)},
		{"image range", protocol.InstanceImagePath + withRef, http.Header{"Range": {"bytes=4-7"}}, http.StatusPartialContent, "disk"},
		{"another node's image", protocol.InstanceImagePath + other, nil, http.StatusNotFound, ""},
		{"user data from a secret", protocol.InstanceUserDataPath + withRef, nil, http.StatusOK, "#cloud-config secret"},
		{"plain user data", protocol.InstanceUserDataPath + plain, nil, http.StatusOK, "#cloud-config plain"},
		{"another node's user data", protocol.InstanceUserDataPath + other, nil, http.StatusNotFound, ""},
		{"missing", protocol.InstanceUserDataPath + "inst_missing", nil, http.StatusNotFound, ""},
		{"env with a secret", protocol.InstanceEnvPath + withRef, nil, http.StatusOK, `{"MODE":"plain","SEED":"#cloud-config secret"}` + "\n"},
		{"no env", protocol.InstanceEnvPath + plain, nil, http.StatusOK, "{}\n"},
		{"another node's env", protocol.InstanceEnvPath + other, nil, http.StatusNotFound, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, b := get(tc.path, tc.header)
			if status != tc.status || (tc.body != "" && string(b) != tc.body) {
				t.Fatalf("%s = %d %q", tc.path, status, b)
			}
		})
	}
	if n := ae.count(`SELECT count(*) FROM secret_resolutions WHERE purpose = 'instance-user-data'`); n != 1 {
		t.Fatalf("resolutions = %d", n)
	}
	if n := ae.count(`SELECT count(*) FROM secret_resolutions WHERE purpose = 'instance-env'`); n != 1 {
		t.Fatalf("env resolutions = %d", n)
	}
}
