package api

import (
	"context"

	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/buildinfo"
)

// APIVersion is the version of the call contract this server speaks.
const APIVersion = "v0.1"

// registerHandlers is the table of methods this server serves; every other
// method of the registry answers UNSUPPORTED (planned).
func (s *Server) registerHandlers() map[string]handler {
	return map[string]handler{
		"system.version":   {direct: s.systemVersion},
		"system.whoami":    {direct: s.systemWhoami},
		"system.selfCheck": {direct: s.systemSelfCheck},
		"projects.create":  {run: s.projectsCreate},
		"projects.get":     {run: s.projectsGet},
		"projects.list":    {list: s.projectsList},
		"projects.archive": {run: s.projectsArchive},

		"sites.create":      {run: s.sitesCreate},
		"sites.get":         {run: s.sitesGet},
		"sites.list":        {list: s.sitesList},
		"sites.update":      {run: s.sitesUpdate, refresh: true},
		"sites.delete":      {run: s.sitesDelete},
		"siteTokens.create": {run: s.siteTokensCreate},
		"siteTokens.revoke": {run: s.siteTokensRevoke},

		"pools.create":  {run: s.poolsCreate},
		"pools.get":     {run: s.poolsGet},
		"pools.list":    {list: s.poolsList},
		"pools.update":  {run: s.poolsUpdate, refresh: true},
		"pools.archive": {run: s.poolsArchive},
		"pools.offer":   {run: s.poolsOffer, refresh: true},
		"pools.unoffer": {run: s.poolsUnoffer, refresh: true},

		// The nodes' SSH certificates stay planned.
		"nodes.list":        {list: s.nodesList},
		"nodes.get":         {run: s.nodesGet},
		"nodes.events":      {run: s.nodesEvents},
		"nodes.cordon":      {run: s.nodesCordon},
		"nodes.drain":       {run: s.nodesDrain, after: s.afterDrain},
		"nodes.adopt":       {run: s.nodesAdopt},
		"nodes.uncordon":    {run: s.nodesUncordon},
		"nodes.label":       {run: s.nodesLabel},
		"nodes.taint":       {run: s.nodesTaint},
		"nodes.delete":      {run: s.nodesDelete},
		"joinTokens.create": {run: s.joinTokensCreate},
		"joinTokens.list":   {run: s.joinTokensList},
		"joinTokens.revoke": {run: s.joinTokensRevoke},

		"joinRequests.list":    {run: s.joinRequestsList},
		"joinRequests.approve": {run: s.joinRequestsApprove},
		"joinRequests.reject":  {run: s.joinRequestsReject},
		"nodes.revokeIdentity": {run: s.nodesRevokeIdentity},

		"inventory.get":     {run: s.inventoryGet},
		"inventory.history": {run: s.inventoryHistory},
		"inventory.diff":    {run: s.inventoryDiff},
		"commands.run":      {run: s.commandsRun},
		"commands.get":      {run: s.commandsGet},
		"commands.list":     {run: s.commandsList},
		"commands.cancel":   {run: s.commandsCancel},
		"quotas.get":        {run: s.quotasGet},
		"quotas.set":        {run: s.quotasSet},

		"pools.capacity":    {run: s.poolsCapacity},
		"capacity.summary":  {run: s.capacitySummary},
		"capacity.byPool":   {run: s.capacityByPool},
		"capacity.timeline": {run: s.capacityTimeline},
		"capacity.preview":  {run: s.capacityPreview},

		"reservations.create":  {admission: s.reservationsAdmission()},
		"reservations.get":     {run: s.reservationsGet},
		"reservations.list":    {list: s.reservationsList},
		"reservations.release": {run: s.reservationsRelease, after: s.afterRelease},
		"reservations.cancel":  {run: s.reservationsCancel, after: s.afterCancel},
		"reservations.renew":   {run: s.reservationsRenew, after: s.afterRenew},
		"reservations.extend":  {admission: s.reservationsExtendAdmission()},

		"events.list": {run: s.eventsList},
		"usage.list":  {run: s.usageList},
	}
}

// VersionOutput is system.version's answer.
type VersionOutput struct {
	buildinfo.Info
	API string `json:"api"`
}

func (s *Server) systemVersion(context.Context, *Call) (any, error) {
	return VersionOutput{Info: buildinfo.Get(), API: APIVersion}, nil
}

// WhoamiOutput is system.whoami's answer: who the credential belongs to, or
// authenticated false when none was presented.
type WhoamiOutput struct {
	Authenticated bool `json:"authenticated"`
	*iam.Caller
}

func (s *Server) systemWhoami(ctx context.Context, c *Call) (any, error) {
	if !c.Cred.Present() {
		return WhoamiOutput{}, nil
	}
	caller, err := s.authenticate(ctx, c.Cred)
	if err != nil {
		return nil, err
	}
	return WhoamiOutput{Authenticated: true, Caller: caller}, nil
}

// SelfCheckOutput is system.selfCheck's answer.
type SelfCheckOutput struct {
	Health
	Projection ProjectionCheck `json:"projection"`
}

// ProjectionCheck is the authorization projection's state.
type ProjectionCheck struct {
	Loaded bool    `json:"loaded"`
	LagMs  float64 `json:"lagMs"`
}

// systemSelfCheck runs the health checks (database, Temporal round trip),
// and reports IAM (it just decided this call) and the projection's lag.
func (s *Server) systemSelfCheck(ctx context.Context, _ *Call) (any, error) {
	out := SelfCheckOutput{Health: s.CheckHealth(ctx)}
	out.Checks["iam"] = Check{OK: true}
	if p := s.deps.Projection; p != nil {
		out.Projection = ProjectionCheck{Loaded: p.Loaded(), LagMs: float64(p.Lag().Microseconds()) / 1000}
		if !p.Loaded() {
			out.Status = "degraded"
		}
	}
	return out, nil
}
