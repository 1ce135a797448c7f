package devstack

import (
	"context"
	"errors"
	"fmt"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/api/sites"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
)

// The demo fleet a newcomer finds in `better-compute dev`: a shared site and
// an H100 pool of the root tenant, offered to the demo tenant with a GPU
// quota, and the demo user holding the "user" relation on the pool, so the
// shipped example policy lets that user reserve there. Its machines are the
// simulated bcd node agents (agents.go), which join it as real machines do.
const (
	demoSite     = "dev-shared"
	demoPool     = "h100"
	demoGPUQuota = 16
)

// DemoFleet names what seedDemoFleet made (or found).
type DemoFleet struct {
	SiteID string `json:"siteId"`
	PoolID string `json:"poolId"`
}

// seedDemoFleet creates the demo fleet through the API itself, as the root
// admin would, finding what an earlier run made instead of making it twice.
func (s *Stack) seedDemoFleet(ctx context.Context) error {
	admin := api.NewClient(s.apiURL, s.tokens.AdminToken)
	if admin.Token == "" {
		var err error
		if admin.Token, err = s.AdminToken(); err != nil {
			return err
		}
	}
	root := s.tokens.RootTenantID
	siteList, err := sites.List.Call(ctx, admin, rpc.TenantListInput{TenantID: root})
	if err != nil {
		return fmt.Errorf("demo fleet: %w", err)
	}
	for _, st := range siteList.Items {
		if st.Name == demoSite {
			s.demo.SiteID = st.ID
		}
	}
	if s.demo.SiteID == "" {
		st, err := sites.Create.Call(ctx, admin, sites.CreateInput{TenantID: root, Name: demoSite, Region: "local", IAMRegion: "dev-local-1", Kind: "shared"})
		if err != nil {
			return fmt.Errorf("demo fleet: site: %w", err)
		}
		s.demo.SiteID = st.ID
	}
	list, err := pools.List.Call(ctx, admin, pools.ListInput{TenantID: root, SiteID: s.demo.SiteID})
	if err != nil {
		return fmt.Errorf("demo fleet: %w", err)
	}
	for _, p := range list.Items {
		if p.Name == demoPool && p.TenantID == root {
			s.demo.PoolID = p.ID
		}
	}
	if s.demo.PoolID == "" {
		p, err := pools.Create.Call(ctx, admin, pools.CreateInput{TenantID: root, SiteID: s.demo.SiteID, Name: demoPool,
			Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80})
		if err != nil {
			return fmt.Errorf("demo fleet: pool: %w", err)
		}
		s.demo.PoolID = p.ID
	}
	if _, err := pools.Offer.Call(ctx, admin, pools.OfferInput{TenantID: root, PoolID: s.demo.PoolID,
		ToTenantID: s.tokens.TenantID, Quota: map[string]int64{"gpu": demoGPUQuota}}); err != nil {
		return fmt.Errorf("demo fleet: offer: %w", err)
	}
	_, err = s.cp.Admin.AddRelation(ctx, iam.Relation{TenantID: s.tokens.TenantID, SubjectID: s.tokens.UserIdentityID,
		Relation: "user", ResourceType: s.cp.Catalog.FullName("pool"), ResourceID: s.demo.PoolID})
	if err != nil && !errors.Is(err, core.ErrConflict) {
		return fmt.Errorf("demo fleet: relation: %w", err)
	}
	return nil
}

// Demo is the demo fleet of the running stack.
func (s *Stack) Demo() DemoFleet { return s.demo }
