// Package sites holds the site workflows. The control plane reaches a
// site's network through the `bcd site` agent that holds the site's boot
// lease, which serves the site's task queue (SiteTaskQueue). The workflows
// run on the control-plane queue; only their activities run on the site's,
// implemented by the agent (agent/site). So this package holds the names
// and payloads both sides use and imports no activities: `bcd site` links
// it without the store.
package sites

import (
	"context"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// Names of the site workflow and activity as registered. They are persisted
// in workflow histories and callers start the workflow by its name, so they
// never change.
const (
	SiteHealthWorkflowName = "SiteHealthWorkflow"
	// ActivitySiteHealth is served by `bcd site` (agent/site) on the site's
	// queue: it answers SiteHealth.
	ActivitySiteHealth = "SiteHealth"
)

// SiteTaskQueuePrefix starts every site's task queue.
const SiteTaskQueuePrefix = "site-"

// SiteTaskQueue is the task queue of the site's agent: "site-<siteId>".
func SiteTaskQueue(siteID string) string { return SiteTaskQueuePrefix + siteID }

// SiteHealth is what a site agent answers: the site, the agent (its lease
// holder) and the fencing epoch it serves under, and its clock.
type SiteHealth struct {
	SiteID string    `json:"siteId"`
	Holder string    `json:"holder"`
	Epoch  int64     `json:"epoch"`
	Time   time.Time `json:"time"`
}

// SiteHealthInput names the site to ask.
type SiteHealthInput struct {
	SiteID string `json:"siteId"`
}

// SiteHealthScheduleToStart bounds how long the activity waits for a site
// agent to pick it up: a site without a serving agent fails the check
// instead of waiting for one forever.
const SiteHealthScheduleToStart = 30 * time.Second

// Register registers the site workflows on the control plane's worker.
func Register(r worker.Registry) {
	r.RegisterWorkflowWithOptions(SiteHealthWorkflow, workflow.RegisterOptions{Name: SiteHealthWorkflowName})
}

// SiteHealthWorkflow asks the site's agent for its health: one SiteHealth
// activity on the site's task queue. It names the activity, as the one
// implementation is in another binary.
func SiteHealthWorkflow(ctx workflow.Context, in SiteHealthInput) (SiteHealth, error) {
	if in.SiteID == "" {
		return SiteHealth{}, temporal.NewNonRetryableApplicationError("a site id is required", "InvalidInput", nil)
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:              SiteTaskQueue(in.SiteID),
		ScheduleToStartTimeout: SiteHealthScheduleToStart,
		StartToCloseTimeout:    10 * time.Second,
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 3},
	})
	var h SiteHealth
	err := workflow.ExecuteActivity(ctx, ActivitySiteHealth, in.SiteID).Get(ctx, &h)
	return h, err
}

// RegisterAgent registers what `bcd site` serves on a site's queue:
// health, the SiteHealth activity of one lease term. It takes no store, so
// the site agent links none.
func RegisterAgent(r worker.ActivityRegistry, health func(ctx context.Context, siteID string) (SiteHealth, error)) {
	r.RegisterActivityWithOptions(health, activity.RegisterOptions{Name: ActivitySiteHealth})
}
