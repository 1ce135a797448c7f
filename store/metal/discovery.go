package metal

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
)

// DiscoveryTokenGrace is how long a site's previous discovery token stays
// valid once the site agent asked for a new one: long enough for the
// discovery ramdisks booted with it to report.
const DiscoveryTokenGrace = time.Hour

// RotateDiscoveryToken mints the site's discovery token, replacing the
// stored hash; the token it replaces stays valid for DiscoveryTokenGrace.
// Only hashes are stored, so the answer is the only clear copy: the site
// agent asks again (rotating) whenever it needs the token and has lost it.
func RotateDiscoveryToken(ctx context.Context, tx store.Tx, siteID string) (string, error) {
	token, err := newToken(protocol.DiscoveryTokenPrefix)
	if err != nil {
		return "", err
	}
	_, err = tx.Exec(ctx, `INSERT INTO site_discovery_tokens (site_id, token_hash) VALUES ($1, $2)
		ON CONFLICT (site_id) DO UPDATE SET previous_hash = site_discovery_tokens.token_hash,
			token_hash = EXCLUDED.token_hash, rotated_at = now()`, siteID, HashToken(token))
	return token, err
}

// Discovered is a machine that booted a site's discovery ramdisk.
type Discovered struct {
	ID          string                   `json:"id"`
	SiteID      string                   `json:"siteId"`
	BootMAC     string                   `json:"bootMac"`
	HardwareKey string                   `json:"hardwareKey,omitempty"`
	Inventory   *inventory.NodeInventory `json:"inventory"`
	FirstSeenAt int64                    `json:"firstSeenAt"`
	LastSeenAt  int64                    `json:"lastSeenAt"`
	// NodeID is the node it was confirmed as ("" until metal.confirmMac).
	NodeID         string `json:"nodeId,omitempty"`
	lastSeenMicros int64
}

// Key is the discovered machine's place in its site's list (newest seen
// first).
func (d Discovered) Key() store.Key { return store.Key{At: d.lastSeenMicros, ID: d.ID} }

// Discover records a machine that booted the site's discovery ramdisk,
// authenticated by the site's discovery token (its current or, within the
// grace, its previous one): upserted by (site, boot MAC). An unknown token
// is UNAUTHENTICATED.
func Discover(ctx context.Context, tx store.Tx, token, bootMAC string, doc []byte) (Discovered, error) {
	siteID, tenantID, err := discoverySite(ctx, tx, token)
	if err != nil {
		return Discovered{}, err
	}
	mac, err := NormalizeMAC("bootMac", bootMAC)
	if err != nil {
		return Discovered{}, err
	}
	inv, err := inventory.Parse(doc)
	if err != nil {
		return Discovered{}, core.Wrap(core.CodeInvalidInput, err, "inventory is not a NodeInventory v1 document").
			WithDetails(map[string]any{"field": "inventory"})
	}
	hk := inventory.ComputeHardwareKey(inv)
	return scanDiscovered(tx.QueryRow(ctx, `INSERT INTO metal_discovered (id, site_id, tenant_id, boot_mac, hardware_key, inventory)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (site_id, boot_mac) DO UPDATE SET hardware_key = EXCLUDED.hardware_key, inventory = EXCLUDED.inventory,
			last_seen_at = now()
		RETURNING `+discoveredColumns, core.NewID("mdisc"), siteID, tenantID, mac, hk.Key, string(doc)))
}

// DiscoveryResult authenticates the results a discovery ramdisk posts
// (its power-off): a discovered machine runs no step the control plane
// waits for, so they are acknowledged, not stored.
func DiscoveryResult(ctx context.Context, tx store.Tx, token string) error {
	_, _, err := discoverySite(ctx, tx, token)
	return err
}

// discoverySite is the site (and its owner) of a discovery token, current
// or previous within the grace; any other token is UNAUTHENTICATED.
func discoverySite(ctx context.Context, tx store.Tx, token string) (siteID, tenantID string, err error) {
	if !strings.HasPrefix(token, protocol.DiscoveryTokenPrefix) {
		return "", "", unknownToken()
	}
	err = tx.QueryRow(ctx, `SELECT t.site_id, s.tenant_id FROM site_discovery_tokens t JOIN sites s ON s.id = t.site_id
		WHERE s.deleted_at IS NULL AND (t.token_hash = $1
			OR (t.previous_hash = $1 AND t.rotated_at > now() - make_interval(secs => $2)))`,
		HashToken(token), DiscoveryTokenGrace.Seconds()).Scan(&siteID, &tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", unknownToken()
	}
	return siteID, tenantID, err
}

const discoveredColumns = `id, site_id, boot_mac, hardware_key, inventory, first_seen_at, last_seen_at, node_id`

func scanDiscovered(row pgx.Row) (Discovered, error) {
	var d Discovered
	var doc []byte
	var first, last time.Time
	if err := row.Scan(&d.ID, &d.SiteID, &d.BootMAC, &d.HardwareKey, &doc, &first, &last, &d.NodeID); err != nil {
		return Discovered{}, err
	}
	inv, err := inventory.Parse(doc)
	if err != nil {
		return Discovered{}, err
	}
	d.Inventory = inv
	d.FirstSeenAt, d.LastSeenAt, d.lastSeenMicros = first.UnixMilli(), last.UnixMilli(), last.UnixMicro()
	return d, nil
}

// ListDiscovered reads the machines that booted the site's discovery
// ramdisk, for the site's owning tenant only (any other tenant, and a
// deleted site, is NOT_FOUND): newest seen first, the page's rows after
// its key plus one.
func ListDiscovered(ctx context.Context, tx store.Tx, tenantID, siteID string, page store.PageQuery) ([]Discovered, error) {
	var owner string
	err := tx.QueryRow(ctx, `SELECT tenant_id FROM sites WHERE id = $1 AND deleted_at IS NULL`, siteID).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && owner != tenantID) {
		return nil, core.Errorf(core.CodeNotFound, "site %s not found", siteID)
	}
	if err != nil {
		return nil, err
	}
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+discoveredColumns+` FROM metal_discovered
		WHERE site_id = $1 AND tenant_id = $2 AND ($4 OR ((floor(extract(epoch FROM last_seen_at) * 1000000)::bigint), id) < ($5, $6))
		ORDER BY last_seen_at DESC, id DESC LIMIT $3`, siteID, tenantID, page.Fetch(), page.First(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Discovered, error) { return scanDiscovered(r) })
}

// ConfirmMAC confirms the boot MAC of the tenant's enrolled node: once the
// node was inspected the MAC must be one of its inventory's (else
// INVALID_INPUT naming mac). A machine discovered at the node's site with
// that MAC is linked to the node, and its inventory ingested when the node
// has none.
func ConfirmMAC(ctx context.Context, tx store.Tx, t nodes.Types, tenantID, nodeID, mac, by string) (Node, error) {
	mac, err := NormalizeMAC("mac", mac)
	if err != nil {
		return Node{}, err
	}
	n, err := Get(ctx, tx, tenantID, nodeID, true)
	if err != nil {
		return Node{}, err
	}
	macs, hasInventory, err := nodes.InventoryMACs(ctx, tx, nodeID)
	if err != nil {
		return Node{}, err
	}
	known := make([]string, 0, len(macs))
	for _, m := range macs {
		if v, err := NormalizeMAC("mac", m); err == nil {
			known = append(known, v)
		}
	}
	if n.Lifecycle.Inspected && !slices.Contains(known, mac) {
		return Node{}, badField("mac", "notInInventory", "mac is none of the node's inspected NICs")
	}
	if _, err := tx.Exec(ctx, `UPDATE node_bmcs SET boot_mac = $2, boot_mac_confirmed_at = now(), updated_at = now()
		WHERE node_id = $1`, nodeID, mac); err != nil {
		return Node{}, err
	}
	d, err := scanDiscovered(tx.QueryRow(ctx, `UPDATE metal_discovered SET node_id = $3
		WHERE site_id = $1 AND boot_mac = $2 AND tenant_id = $4 AND node_id IN ('', $3) RETURNING `+discoveredColumns,
		n.Node.SiteID, mac, nodeID, tenantID))
	linked := ""
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return Node{}, err
	default:
		linked = d.ID
		if !hasInventory {
			if other, err := nodes.HardwareKeyOwner(ctx, tx, d.HardwareKey, nodeID); err != nil || other != "" {
				if err != nil {
					return Node{}, err
				}
				return Node{}, core.Errorf(core.CodeConflict, "the discovered machine's hardware key is node %s's", other).
					WithDetails(map[string]any{"nodeId": other, "reason": "hardwareKeyConflict"})
			}
			raw, err := discoveredDoc(ctx, tx, d.ID)
			if err != nil {
				return Node{}, err
			}
			if _, err := nodes.Ingest(ctx, tx, t, nodeID, raw); err != nil {
				return Node{}, err
			}
		}
	}
	if err := nodes.AddEvent(ctx, tx, nodeID, EventBootMACConfirmed, "boot MAC "+mac+" confirmed by "+by,
		map[string]any{"mac": mac, "by": by, "discoveredId": linked}); err != nil {
		return Node{}, err
	}
	return Get(ctx, tx, tenantID, nodeID, false)
}

func discoveredDoc(ctx context.Context, tx store.Tx, id string) ([]byte, error) {
	var raw []byte
	err := tx.QueryRow(ctx, `SELECT inventory FROM metal_discovered WHERE id = $1`, id).Scan(&raw)
	return raw, err
}

// SiteNode is an enrolled node as its site's agent sees it: its tenant and
// its BMC endpoints (secret references, never values).
type SiteNode struct {
	NodeID   string
	TenantID string
	BMC      BMC
}

// NodeOfSite reads an enrolled node of siteID for its site agent; a node
// of another site, a deleted one or none is NOT_FOUND alike.
func NodeOfSite(ctx context.Context, tx store.Tx, siteID, nodeID string) (SiteNode, error) {
	var s SiteNode
	var r RedfishEndpoint
	var i IPMIEndpoint
	err := tx.QueryRow(ctx, `SELECT b.node_id, b.tenant_id, b.redfish_address, b.redfish_username, b.redfish_password_ref,
			b.redfish_ca_pem, b.redfish_insecure, b.ipmi_address, b.ipmi_username, b.ipmi_password_ref, b.boot_mac
		FROM node_bmcs b JOIN nodes n ON n.id = b.node_id
		WHERE b.node_id = $1 AND b.site_id = $2 AND n.deleted_at IS NULL`, nodeID, siteID).
		Scan(&s.NodeID, &s.TenantID, &r.Address, &r.Username, &r.PasswordSecret, &r.CAPEM, &r.InsecureSkipVerify,
			&i.Address, &i.Username, &i.PasswordSecret, &s.BMC.BootMAC)
	if errors.Is(err, pgx.ErrNoRows) {
		return SiteNode{}, nodes.NotFound(nodeID)
	}
	if err != nil {
		return SiteNode{}, err
	}
	if r.Address != "" {
		s.BMC.Redfish = &r
	}
	if i.Address != "" {
		s.BMC.IPMI = &i
	}
	return s, nil
}

// RecordCredentialsUse records on the node's history that its site's agent
// received its BMC credentials (the references, never the values).
func RecordCredentialsUse(ctx context.Context, tx store.Tx, s SiteNode, siteID string) error {
	return nodes.AddEvent(ctx, tx, s.NodeID, EventCredentialsUsed, "BMC credentials resolved for the agent of site "+siteID,
		map[string]any{"siteId": siteID, "secrets": s.BMC.SecretRefs()})
}
