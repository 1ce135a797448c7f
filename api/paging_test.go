package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/projects"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/store"
)

// Sizes of the paging test: more rows than ten pages hold, and rows added
// between the first pages.
const (
	pagingRows     = 1010
	pagingLimit    = 100
	pagingAdded    = 7 // rows inserted after each of the first pages
	pagingAddPages = 10
)

// pagingCase is how the paging test fills one list and reads it back.
type pagingCase struct {
	input map[string]any // the list's fields besides limit and cursor
	// insert adds n rows numbered from first and answers the keys (itemKey)
	// of the rows it added.
	insert func(first, n int) []string
	// itemKey names an answered item; its "id" when nil.
	itemKey func(item map[string]any) string
	// token is the caller's; the acme admin's when "".
	token string
}

// isList reports whether a served method answers a list: named *.list, run
// by the list recipe, or answering items.
func isList(info rpc.Info, h *rpc.Handler) bool {
	if strings.HasSuffix(info.Name, ".list") || h.List != nil {
		return true
	}
	out := info.Output
	for out.Kind() == reflect.Pointer {
		out = out.Elem()
	}
	if out.Kind() != reflect.Struct {
		return false
	}
	for _, f := range reflect.VisibleFields(out) {
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name == "items" && f.Type.Kind() == reflect.Slice {
			return true
		}
	}
	return false
}

// specFixedLists keep the input and the cap the spec gives them (planned
// today): they do not page, and answer truncated when the cap cut them.
var specFixedLists = map[string]bool{
	"cloudResources.list": true, "cloudResources.signals": true, "cloudResources.discover": true, "cloudResources.catalog": true,
}

// answers reports whether the method's answer has the JSON field name.
func answers(info rpc.Info, name string) bool {
	out := info.Output
	for out.Kind() == reflect.Pointer {
		out = out.Elem()
	}
	if out.Kind() != reflect.Struct {
		return false
	}
	for _, f := range reflect.VisibleFields(out) {
		if n, _, _ := strings.Cut(f.Tag.Get("json"), ","); n == name {
			return true
		}
	}
	return false
}

// pages embeds rpc.ListInput and answers nextCursor.
func pages(info rpc.Info) error {
	embeds := false
	for _, f := range reflect.VisibleFields(info.Input) {
		if f.Anonymous && f.Type == reflect.TypeFor[rpc.ListInput]() {
			embeds = true
		}
	}
	if !embeds {
		return fmt.Errorf("its input %s does not embed rpc.ListInput", info.Input)
	}
	if !answers(info, "nextCursor") {
		return fmt.Errorf("its answer %s has no nextCursor", info.Output)
	}
	return nil
}

// clone copies the one row of table that where selects once for each g in
// [first, first+n), with the columns set names (a jsonb_build_object
// argument list of SQL over g) replaced; the column list is the table's
// own, so the test does not repeat it.
func (e *env) clone(table, where string, first, n int, set string, args ...any) {
	e.t.Helper()
	sql := fmt.Sprintf(`INSERT INTO %[1]s SELECT (jsonb_populate_record(NULL::%[1]s, to_jsonb(s) || jsonb_build_object(%[2]s))).*
		FROM %[1]s s, generate_series($1::int, $2::int) g WHERE %[3]s`, table, set, where)
	tag, err := e.store.Pool.Exec(context.Background(), sql, append([]any{first, first + n - 1}, args...)...)
	if err != nil {
		e.t.Fatalf("clone %s: %v", table, err)
	}
	if tag.RowsAffected() != int64(n) {
		e.t.Fatalf("clone %s: %d rows, want %d", table, tag.RowsAffected(), n)
	}
}

// cloneResource clones a domain row and its authorization row, each clone
// with id prefix_pgNNNNNN and the extra columns set.
func (e *env) cloneResource(table, typ, seedID, prefix string, first, n int, set string) []string {
	e.t.Helper()
	id := fmt.Sprintf(`'%s_pg' || lpad(g::text, 6, '0')`, prefix)
	cols := `'id', ` + id + `, 'created_at', now()`
	if set != "" {
		cols += ", " + set
	}
	e.clone(table, "s.id = $3", first, n, cols, seedID)
	e.clone("authz_resources", "s.type = $3 AND s.id = $4", first, n, `'id', `+id, e.catalog.FullName(typ), seedID)
	return pagingIDs(prefix, first, n)
}

func pagingIDs(prefix string, first, n int) []string {
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s_pg%06d", prefix, first+i)
	}
	return ids
}

// Every list of the registry pages: more than a thousand rows, read in
// pages of 100 while rows are inserted between pages, come back with no
// duplicate and no gap, the page is never longer than its limit, the last
// page has no nextCursor, and a malformed cursor is INVALID_INPUT on
// cursor. A list served later without a case here fails the test.
// pagingWebhook is the webhook whose deliveries the paging test lists.
var pagingWebhook = core.NewID("whk")

func TestEveryListPagesWithoutGapsOrDuplicates(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	admin := e.boot.UserToken
	owner := e.identityOf(admin)

	site := e.site(admin, "acme", "paging-site", "custom")
	pool := e.poolWith("acme", site.ID, "paging-pool", "H100", "", `{}`)
	node := e.node(schedulableNode(pool.ID, "paging-node"), fixture(t, "h100-8x-sxm.json"))
	project, err := projects.Create.Call(ctx, e.client(admin), projects.CreateInput{TenantID: "acme", Name: "paging"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.RunCommand.Call(ctx, e.client(admin), nodes.RunCommandInput{TenantID: "acme", NodeID: node.ID,
		Kind: protocol.CommandInventoryRefresh}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.CreateJoinToken.Call(ctx, e.client(admin), nodes.CreateJoinTokenInput{TenantID: "acme", PoolID: pool.ID}); err != nil {
		t.Fatal(err)
	}
	var tokenID string
	if err := e.store.Pool.QueryRow(ctx, `SELECT id FROM join_tokens WHERE pool_id = $1`, pool.ID).Scan(&tokenID); err != nil {
		t.Fatal(err)
	}
	// quotas.get lists the offers acme received: globex's pools offered to it.
	gsite := e.site(e.globex, "globex", "paging-g", "custom")
	gpool := e.pool(e.globex, "globex", gsite.ID, "paging-g")
	if _, err := pools.Offer.Call(ctx, e.client(e.globex), pools.OfferInput{TenantID: "globex", PoolID: gpool.ID, ToTenantID: "acme"}); err != nil {
		t.Fatal(err)
	}

	// flavors.list lists a vps-host pool's flavors.
	vpsPool := e.classPool(site.ID, "paging-vps", "vps-host", "", "", "")

	seq := func(item map[string]any) string { return fmt.Sprint(item["seq"]) }
	cases := map[string]pagingCase{
		"providerAccounts.list": {input: map[string]any{"tenantId": "acme"}, insert: func(first, n int) []string {
			ids := pagingIDs("pacct", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO provider_accounts (id, tenant_id, provider, name, credential_ref, created_by)
				SELECT id, 'acme', 'digitalocean', id, 'secret://acme/do', 'idn_x' FROM unnest($1::text[]) id`, ids); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO authz_resources (type, id, tenant_id)
				SELECT $2, id, 'acme' FROM unnest($1::text[]) id`, ids, e.catalog.FullName("provider-account")); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"flavors.list": {input: map[string]any{"tenantId": "acme", "poolId": vpsPool.ID}, insert: func(first, n int) []string {
			ids := pagingIDs("flv", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO flavors (id, tenant_id, pool_id, name, vcpu, memory_mib, runtime)
				SELECT id, 'acme', $2, id, 1, 1024, 'container' FROM unnest($1::text[]) id`, ids, vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"instances.list": {input: map[string]any{"tenantId": "acme", "scope": "all"}, insert: func(first, n int) []string {
			ids := pagingIDs("inst", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO flavors (id, tenant_id, pool_id, name, vcpu, memory_mib, runtime)
				VALUES ('flv_pg', 'acme', $1, 'paging', 1, 1024, 'container') ON CONFLICT DO NOTHING`, vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO instances (id, tenant_id, owner_identity_id, pool_id, flavor_id, image_id,
					name, desired_state, state)
				SELECT id, 'acme', $2, $3, 'flv_pg', 'img_pg', 'paging', 'stopped', 'stopped' FROM unnest($1::text[]) id`,
				ids, owner, vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO authz_resources (type, id, tenant_id, owner_id, parent_type, parent_id)
				SELECT $2, id, 'acme', $3, $4, $5 FROM unnest($1::text[]) id`,
				ids, e.catalog.FullName("instance"), owner, e.catalog.FullName("pool"), vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"sandboxTemplates.list": {input: map[string]any{"tenantId": "acme"}, insert: func(first, n int) []string {
			ids := pagingIDs("tpl", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO flavors (id, tenant_id, pool_id, name, vcpu, memory_mib, runtime)
				VALUES ('flv_pg', 'acme', $1, 'paging', 1, 1024, 'container') ON CONFLICT DO NOTHING`, vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO sandbox_templates (id, tenant_id, owner_identity_id, name, pool_id, flavor_id,
					image_id, runtime, default_ttl_seconds, max_ttl_seconds, ttl_action)
				SELECT id, 'acme', $2, id, $3, 'flv_pg', 'img_pg', 'gvisor', 60, 60, 'delete' FROM unnest($1::text[]) id`,
				ids, owner, vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO authz_resources (type, id, tenant_id, owner_id)
				SELECT $2, id, 'acme', $3 FROM unnest($1::text[]) id`, ids, e.catalog.FullName("sandbox-template"), owner); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"sandboxes.list": {input: map[string]any{"tenantId": "acme", "ended": true}, insert: func(first, n int) []string {
			// The sandboxes' template has no authorization row, so
			// sandboxTemplates.list's case never sees it.
			tpl := "tpl_pgsandboxes"
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO flavors (id, tenant_id, pool_id, name, vcpu, memory_mib, runtime)
				VALUES ('flv_pg', 'acme', $1, 'paging', 1, 1024, 'container') ON CONFLICT DO NOTHING`, vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO sandbox_templates (id, tenant_id, owner_identity_id, name, pool_id, flavor_id,
					image_id, runtime, default_ttl_seconds, max_ttl_seconds, ttl_action)
				VALUES ($1, 'acme', $2, $1, $3, 'flv_pg', 'img_pg', 'gvisor', 60, 60, 'delete') ON CONFLICT DO NOTHING`,
				tpl, owner, vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			ids := pagingIDs("sbx", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO sandboxes (id, tenant_id, owner_identity_id, template_id, state, ttl_seconds)
				SELECT id, 'acme', $2, $3, 'failed', 60 FROM unnest($1::text[]) id`, ids, owner, tpl); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO authz_resources (type, id, tenant_id, owner_id, parent_type, parent_id)
				SELECT $2, id, 'acme', $3, $4, $5 FROM unnest($1::text[]) id`,
				ids, e.catalog.FullName("sandbox"), owner, e.catalog.FullName("pool"), vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"sandboxSnapshots.list": {input: map[string]any{"tenantId": "acme"}, insert: func(first, n int) []string {
			// One sandbox (of a template without an authorization row)
			// with its workload holds every snapshot.
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO flavors (id, tenant_id, pool_id, name, vcpu, memory_mib, runtime)
				VALUES ('flv_pg', 'acme', $1, 'paging', 1, 1024, 'container') ON CONFLICT DO NOTHING`, vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO sandbox_templates (id, tenant_id, owner_identity_id, name, pool_id, flavor_id,
					image_id, runtime, default_ttl_seconds, max_ttl_seconds, ttl_action)
				VALUES ('tpl_pgsnapshots', 'acme', $1, 'tpl_pgsnapshots', $2, 'flv_pg', 'img_pg', 'gvisor', 60, 60, 'delete') ON CONFLICT DO NOTHING`,
				owner, vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO instances (id, tenant_id, owner_identity_id, pool_id, flavor_id, image_id,
					name, desired_state, state)
				VALUES ('inst_pgsnapshots', 'acme', $1, $2, 'flv_pg', 'img_pg', 'paging', 'stopped', 'stopped') ON CONFLICT DO NOTHING`,
				owner, vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO sandboxes (id, tenant_id, owner_identity_id, template_id, state, ttl_seconds)
				VALUES ('sbx_pgsnapshots', 'acme', $1, 'tpl_pgsnapshots', 'failed', 60) ON CONFLICT DO NOTHING`, owner); err != nil {
				t.Fatal(err)
			}
			ids := pagingIDs("snap", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO sandbox_snapshots (id, tenant_id, owner_identity_id, sandbox_id, template_id,
					instance_id, node_id, runtime, image_id, include_memory, reason, state, failure)
				SELECT id, 'acme', $2, 'sbx_pgsnapshots', 'tpl_pgsnapshots', 'inst_pgsnapshots', 'node_pg', 'gvisor', 'img_pg', true,
					'requested', 'failed', 'paging' FROM unnest($1::text[]) id`, ids, owner); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO authz_resources (type, id, tenant_id, owner_id)
				SELECT $2, id, 'acme', $3 FROM unnest($1::text[]) id`, ids, e.catalog.FullName("sandbox-snapshot"), owner); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"sandboxVolumes.list": {input: map[string]any{"tenantId": "acme", "scope": "all"}, insert: func(first, n int) []string {
			ids := pagingIDs("vol", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO sandbox_volumes (id, tenant_id, owner_identity_id, pool_id, node_id, size_gib, state)
				SELECT id, 'acme', $2, $3, $4, 1, 'ready' FROM unnest($1::text[]) id`, ids, owner, vpsPool.ID, node.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO authz_resources (type, id, tenant_id, owner_id, parent_type, parent_id)
				SELECT $2, id, 'acme', $3, $4, $5 FROM unnest($1::text[]) id`,
				ids, e.catalog.FullName("sandbox-volume"), owner, e.catalog.FullName("pool"), vpsPool.ID); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"nodes.listSshCerts": {input: map[string]any{"tenantId": "acme", "nodeId": node.ID}, insert: func(first, n int) []string {
			ids := pagingIDs("sshc", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO ssh_cas (id, tenant_id, public_key, fingerprint, kek_id, sealed)
				VALUES ('sshca_pg', 'acme', 'ssh-ed25519 AAAApaging', 'SHA256:paging', 'kek', '\x00') ON CONFLICT DO NOTHING`); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO ssh_certificates (id, tenant_id, node_id, ca_id, serial, key_id, users,
					principals, public_key, key_fingerprint, certificate, valid_after, valid_before, issued_by)
				SELECT id, 'acme', $2, 'sshca_pg', $3 + ord, id, '{root}', '{root}', 'ssh-ed25519 AAAA', 'SHA256:k', 'cert',
					now() - interval '2 hours', now() - interval '1 hour', 'idn_x'
				FROM unnest($1::text[]) WITH ORDINALITY AS u(id, ord)`, ids, node.ID, first); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"projects.list": {input: map[string]any{"tenantId": "acme"}, insert: func(first, n int) []string {
			return e.cloneResource("projects", "project", project.ID, "prj", first, n, `'name', 'paging-' || g`)
		}},
		// The drivers are the build's: nothing to insert, the catalog pages.
		"drivers.list": {input: map[string]any{"tenantId": "acme"}, itemKey: func(item map[string]any) string { return fmt.Sprint(item["name"]) },
			insert: func(first, _ int) []string {
				if first > 1 {
					return nil
				}
				return []string{drivers.DriverIPMI, drivers.DriverRedfish}
			}},
		"sites.list": {input: map[string]any{"tenantId": "acme"}, insert: func(first, n int) []string {
			return e.cloneResource("sites", "site", site.ID, "site", first, n, `'name', 'paging-' || g`)
		}},
		"pools.list": {input: map[string]any{"tenantId": "acme", "siteId": site.ID}, insert: func(first, n int) []string {
			return e.cloneResource("pools", "pool", pool.ID, "pool", first, n, `'name', 'paging-' || g`)
		}},
		"nodes.list": {input: map[string]any{"tenantId": "acme", "poolId": pool.ID}, insert: func(first, n int) []string {
			return e.cloneResource("nodes", "node", node.ID, "node", first, n, `'name', 'paging-' || g`)
		}},
		"reservations.list": {input: map[string]any{"tenantId": "acme", "scope": "all"}, insert: func(first, n int) []string {
			ids := pagingIDs("rsv", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO reservations (id, tenant_id, owner_identity_id, pool_id, state, devices, starts_at, ends_at)
				SELECT id, 'acme', $2, $3, 'released', '{"class":"gpu","count":1}', now(), now() + interval '1 hour' FROM unnest($1::text[]) id`,
				ids, owner, pool.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO authz_resources (type, id, tenant_id, owner_id, parent_type, parent_id)
				SELECT $2, id, 'acme', $3, $4, $5 FROM unnest($1::text[]) id`,
				ids, e.catalog.FullName("reservation"), owner, e.catalog.FullName("pool"), pool.ID); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"joinTokens.list": {input: map[string]any{"tenantId": "acme", "poolId": pool.ID}, insert: func(first, n int) []string {
			e.clone("join_tokens", "s.id = $3", first, n,
				`'id', 'jt_pg' || lpad(g::text, 6, '0'), 'created_at', now(), 'token_hash', sha256(convert_to('jt_pg' || g, 'UTF8'))`, tokenID)
			return pagingIDs("jt", first, n)
		}},
		"joinRequests.list": {input: map[string]any{"tenantId": "acme", "poolId": pool.ID}, insert: func(first, n int) []string {
			ids := pagingIDs("jreq", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO join_requests (id, tenant_id, pool_id, join_token_id, name, inventory, csr, request_secret_hash)
				SELECT id, 'acme', $2, $3, id, '{}', '', sha256(convert_to(id, 'UTF8')) FROM unnest($1::text[]) id`,
				ids, pool.ID, tokenID); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"commands.list": {input: map[string]any{"tenantId": "acme", "nodeId": node.ID}, itemKey: seq, insert: func(first, n int) []string {
			e.clone("node_commands", "s.node_id = $3 AND s.seq = 1", first, n,
				`'id', 'cmd_pg' || lpad(g::text, 6, '0'), 'seq', g + 1, 'created_at', now()`, node.ID)
			return seqs(first+1, n)
		}},
		"nodes.events": {input: map[string]any{"tenantId": "acme", "nodeId": node.ID}, insert: func(first, n int) []string {
			e.clone("node_events", "s.id = (SELECT min(id) FROM node_events WHERE node_id = $3)", first, n,
				`'id', 'nev_pg' || lpad(g::text, 6, '0'), 'at', now()`, node.ID)
			return pagingIDs("nev", first, n)
		}},
		"inventory.history": {input: map[string]any{"tenantId": "acme", "nodeId": node.ID}, itemKey: seq, insert: func(first, n int) []string {
			e.clone("node_inventories", "s.node_id = $3 AND s.seq = 1", first, n, `'seq', g + 1`, node.ID)
			return seqs(first+1, n)
		}},
		"quotas.get": {input: map[string]any{"tenantId": "acme"},
			itemKey: func(item map[string]any) string { return fmt.Sprint(item["poolId"]) },
			insert: func(first, n int) []string {
				e.clone("pools", "s.id = $3", first, n, `'id', 'pool_pq' || lpad(g::text, 6, '0'), 'name', 'paging-q' || g`, gpool.ID)
				e.clone("pool_offers", "s.pool_id = $3 AND s.tenant_id = 'acme'", first, n, `'pool_id', 'pool_pq' || lpad(g::text, 6, '0')`, gpool.ID)
				ids := make([]string, n)
				for i := range ids {
					ids[i] = fmt.Sprintf("pool_pq%06d", first+i)
				}
				return ids
			}},
		"events.list": {input: map[string]any{"tenantId": "acme"}, insert: func(first, n int) []string {
			ids := make([]string, 0, n)
			err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
				for range n {
					if err := store.PublishEvent(ctx, tx, reservationEvent("acme", "rsv_paging", "", "pending", "active")); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			rows, err := e.store.Pool.Query(ctx, `SELECT id FROM events WHERE tenant_id = 'acme' ORDER BY tenant_seq DESC LIMIT $1`, n)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			if rows.Close(); rows.Err() != nil {
				t.Fatal(rows.Err())
			}
			return ids
		}},
		"metal.discovered": {input: map[string]any{"tenantId": "acme", "siteId": site.ID}, insert: func(first, n int) []string {
			ids := pagingIDs("mdisc", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO metal_discovered (id, site_id, tenant_id, boot_mac, inventory)
				SELECT id, $2, 'acme', id, $3 FROM unnest($1::text[]) id`, ids, site.ID, string(fixture(t, "cpu-only.json"))); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"releases.list": {input: map[string]any{"tenantId": api.DefaultRootTenant}, token: e.boot.AdminToken,
			insert: func(first, n int) []string {
				ids := pagingIDs("rel", first, n)
				if _, err := e.store.Pool.Exec(ctx, `INSERT INTO releases (id, tenant_id, name, version, kind, artifacts, agent_version, created_by)
				SELECT id, $2, 'bcd', id, 'bcd', '[]', 'bcd/x', 'idn_x' FROM unnest($1::text[]) id`, ids, api.DefaultRootTenant); err != nil {
					t.Fatal(err)
				}
				return ids
			}},
		"rollouts.list": {input: map[string]any{"tenantId": api.DefaultRootTenant}, token: e.boot.AdminToken,
			insert: func(first, n int) []string {
				ids := pagingIDs("rollout", first, n)
				if _, err := e.store.Pool.Exec(ctx, `INSERT INTO releases (id, tenant_id, name, version, kind, artifacts, agent_version, created_by)
				VALUES ('rel_pg', $1, 'bcd', 'pg', 'bcd', '[]', 'bcd/x', 'idn_x') ON CONFLICT DO NOTHING`, api.DefaultRootTenant); err != nil {
					t.Fatal(err)
				}
				if _, err := e.store.Pool.Exec(ctx, `INSERT INTO rollouts (id, tenant_id, release_id, pool_id, state, waves, node_timeout_s, created_by)
				SELECT id, $2, 'rel_pg', $3, 'aborted', 1, 60, 'idn_x' FROM unnest($1::text[]) id`, ids, api.DefaultRootTenant, pool.ID); err != nil {
					t.Fatal(err)
				}
				return ids
			}},
		"images.list": {input: map[string]any{"tenantId": "acme"}, insert: func(first, n int) []string {
			ids := pagingIDs("img", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO images (id, tenant_id, name, version, format, sha256, size_bytes, created_by)
				SELECT id, 'acme', id, '1', 'raw', repeat('a', 64), 1, 'idn_x' FROM unnest($1::text[]) id`, ids); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO authz_resources (type, id, tenant_id, attributes)
				SELECT $2, id, 'acme', '{"visibility":"private","verified":false}' FROM unnest($1::text[]) id`,
				ids, e.catalog.FullName("image")); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"workflows.list": {input: map[string]any{"tenantId": "acme", "nodeId": node.ID}, insert: func(first, n int) []string {
			ids := pagingIDs("wf", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO workflows (id, tenant_id, node_id, profile_id, profile_version, op_seq,
					state, context, created_by)
				SELECT id, 'acme', $2, 'prof_pg', 1, 0, 'succeeded', '{}', 'idn_x' FROM unnest($1::text[]) id`, ids, node.ID); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"profiles.list": {input: map[string]any{"tenantId": "acme"}, insert: func(first, n int) []string {
			ids := pagingIDs("prof", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO profiles (id, tenant_id, name, target, latest_version, created_by)
				SELECT id, 'acme', id, 'metal', 1, 'idn_x' FROM unnest($1::text[]) id`, ids); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO authz_resources (type, id, tenant_id)
				SELECT $2, id, 'acme' FROM unnest($1::text[]) id`, ids, e.catalog.FullName("profile")); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"commandBatches.list": {input: map[string]any{"tenantId": "acme"}, insert: func(first, n int) []string {
			ids := pagingIDs("batch", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO command_batches (id, tenant_id, state, commands, selection, nodes, digest,
					quorum, concurrency, max_failures, node_timeout_s, approval_ttl_s, created_by, creator)
				SELECT id, 'acme', 'cancelled', '[]', '{}', '{}', 'sha256:x', 1, 1, 0, 60, 60, 'idn_x', '{}' FROM unnest($1::text[]) id`, ids); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"webhooks.list": {input: map[string]any{"tenantId": "acme"}, insert: func(first, n int) []string {
			ids := pagingIDs("whk", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO webhooks (id, tenant_id, url, event_types, state, secret_kek, secret_sealed,
					cursor, created_by)
				SELECT id, 'acme', 'https://example.com/hook', '{*}', 'active', 'kek', '\x00', 0, 'idn_x' FROM unnest($1::text[]) id`, ids); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"webhooks.deliveries": {input: map[string]any{"tenantId": "acme", "webhookId": pagingWebhook}, insert: func(first, n int) []string {
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO webhooks (id, tenant_id, url, event_types, state, secret_kek, secret_sealed,
					cursor, created_by)
				VALUES ($1, 'acme', 'https://example.com/hook', '{*}', 'disabled', 'kek', '\x00', 0, 'idn_x') ON CONFLICT DO NOTHING`,
				pagingWebhook); err != nil {
				t.Fatal(err)
			}
			ids := pagingIDs("msg", first, n)
			if _, err := e.store.Pool.Exec(ctx, `INSERT INTO webhook_deliveries (id, webhook_id, tenant_id, event_type, payload, state)
				SELECT id, $2, 'acme', 'webhook.ping', '{}', 'delivered' FROM unnest($1::text[]) id`, ids, pagingWebhook); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		"usage.list": {input: map[string]any{"tenantId": "acme", "from": usageMs(0), "to": usageMs(12), "groupBy": "reservation"},
			itemKey: func(item map[string]any) string { return fmt.Sprint(item["reservationId"]) },
			insert: func(first, n int) []string {
				ids := pagingIDs("rsv_u", first, n)
				if _, err := e.store.Pool.Exec(ctx, `INSERT INTO usage_intervals
					(reservation_id, tenant_id, project_id, pool_id, gpu_model, class, units, started_at, ended_at)
					SELECT id, 'acme', '', 'pool_1', 'H100', 'gpu', 1, $2, $3 FROM unnest($1::text[]) id`,
					ids, usageAt(1), usageAt(2)); err != nil {
					t.Fatal(err)
				}
				return ids
			}},
	}

	var listed []string
	for _, domain := range api.Domains {
		for _, d := range domain(rpc.Deps{Catalog: e.catalog, RootTenant: api.DefaultRootTenant}) {
			info := d.Info()
			if !isList(info, d.Handler()) {
				continue
			}
			listed = append(listed, info.Name)
			t.Run(info.Name, func(t *testing.T) {
				if specFixedLists[info.Name] {
					if !answers(info, "truncated") {
						t.Fatalf("%s keeps the spec's input and cap, so its answer must say truncated when the cap cut it", info.Name)
					}
					return
				}
				if err := pages(info); err != nil {
					t.Fatalf("%s does not page: %v", info.Name, err)
				}
				tc, ok := cases[info.Name]
				if !ok {
					t.Fatalf("%s has no paging case: add one", info.Name)
				}
				e.t = t
				token := admin
				if tc.token != "" {
					token = tc.token
				}
				e.pageThrough(t, token, info.Name, tc)
			})
		}
	}
	slices.Sort(listed)
	if len(listed) < len(cases) {
		t.Fatalf("the registry lists %v; cases name lists it does not serve", listed)
	}
}

func seqs(first, n int) []string {
	out := make([]string, n)
	for i := range n {
		out[i] = fmt.Sprint(first + i)
	}
	return out
}

// pageThrough fills the list, reads it in pages while inserting rows, and
// checks what came back.
func (e *env) pageThrough(t *testing.T, token, method string, tc pagingCase) {
	key := tc.itemKey
	if key == nil {
		key = func(item map[string]any) string { return fmt.Sprint(item["id"]) }
	}
	initial := tc.insert(1, pagingRows)
	next := pagingRows + 1
	seen := map[string]int{}
	cursor := ""
	for page := 0; ; page++ {
		if page > 2*pagingRows/pagingLimit {
			t.Fatalf("%s: more pages than rows", method)
		}
		in := map[string]any{"limit": pagingLimit}
		for k, v := range tc.input {
			in[k] = v
		}
		if cursor != "" {
			in["cursor"] = cursor
		}
		body, _ := json.Marshal(in)
		status, raw := e.call(token, method, string(body))
		if status != 200 {
			t.Fatalf("%s page %d: %d %s", method, page, status, raw)
		}
		var out struct {
			Items      []map[string]any `json:"items"`
			NextCursor string           `json:"nextCursor"`
		}
		if err := json.Unmarshal([]byte(raw), &out); err != nil {
			t.Fatal(err)
		}
		if len(out.Items) > pagingLimit {
			t.Fatalf("%s page %d: %d items, limit %d", method, page, len(out.Items), pagingLimit)
		}
		for _, it := range out.Items {
			seen[key(it)]++
		}
		if out.NextCursor == "" {
			break
		}
		cursor = out.NextCursor
		if page < pagingAddPages {
			tc.insert(next, pagingAdded)
			next += pagingAdded
		}
	}
	for k, n := range seen {
		if n > 1 {
			t.Errorf("%s: %s listed %d times", method, k, n)
		}
	}
	missing := 0
	for _, k := range initial {
		if seen[k] != 1 {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%s: %d of the %d rows present at the start were not listed", method, missing, len(initial))
	}

	// A malformed cursor names the field.
	in := map[string]any{"cursor": "not a cursor"}
	for k, v := range tc.input {
		in[k] = v
	}
	body, _ := json.Marshal(in)
	if status, raw := e.call(token, method, string(body)); status != 400 || !strings.Contains(raw, `"field":"cursor"`) ||
		!strings.Contains(raw, string(core.CodeInvalidInput)) {
		t.Errorf("%s with a malformed cursor = %d %s, want INVALID_INPUT on cursor", method, status, raw)
	}
}
