// Package provisioning is the model of provisioning workflows as data: the
// runners a step runs on, the actions each runner takes, the rendered step
// a workflow persists (its arguments, timeout, retry policy and await), the
// context every step of one workflow shares (the image, the user data, the
// host configuration), and the states a workflow and its steps go through.
//
// A profile (core/profiles) renders into these steps for one target;
// store/workflows persists them as a workflow (wf_…); the node's lifecycle
// workflow (<nodeId>/metal) runs them one at a time, recording each
// attempt, so a step's state, output and timings survive any crash and a
// failed step can be run again in the same workflow.
package provisioning

import (
	"slices"
	"time"
)

// Runner is where a step runs.
type Runner string

// The runners.
const (
	// RunnerControlPlane: an activity of the control-plane worker.
	RunnerControlPlane Runner = "control-plane"
	// RunnerSite: an activity of the site agent (`bcd site`) on the site's
	// task queue: BMC calls, the boot server, the image cache.
	RunnerSite Runner = "site"
	// RunnerNode: a command to the node's agent (`bcd node`), once it
	// joined (after an await: rejoin, or on a node already deployed).
	RunnerNode Runner = "node"
	// RunnerRamdisk: a step of the ramdisk's agent (`bcd ramdisk`) in the
	// machine's open ramdisk boot.
	RunnerRamdisk Runner = "ramdisk"
)

// Runners lists every runner.
var Runners = []Runner{RunnerControlPlane, RunnerSite, RunnerNode, RunnerRamdisk}

// Enum makes an input field of this type take only these values.
func (Runner) Enum() []string {
	out := make([]string, len(Runners))
	for i, r := range Runners {
		out[i] = string(r)
	}
	return out
}

// AwaitRejoin is the one value of a step's await: after the step (one
// that ends the agent's boot, a reboot), wait until the machine's agent
// joined again with the node's hardware key.
const AwaitRejoin = "rejoin"

// Retry is a step's retry policy: MaxAttempts tries in all (1: no retry),
// BackoffSeconds before the second, doubling to at most MaxBackoff.
type Retry struct {
	MaxAttempts    int `json:"maxAttempts"`
	BackoffSeconds int `json:"backoffSeconds"`
}

// Bounds of a step's policy.
const (
	MaxAttempts    = 10
	MaxBackoff     = 10 * time.Minute
	MinStepTimeout = time.Second
	MaxStepTimeout = 24 * time.Hour
	// MaxSteps bounds a workflow.
	MaxSteps = 64
	// MaxOutputBytes bounds what a step's attempt keeps as its output.
	MaxOutputBytes = 64 << 10
)

// Step is one rendered step, as a workflow persists and runs it.
type Step struct {
	// Name is unique within the workflow (a DNS label).
	Name   string `json:"name"`
	On     Runner `json:"on"`
	Action string `json:"action"`
	// Args are the action's arguments, templates already rendered.
	Args map[string]any `json:"args,omitempty"`
	// Await is "" or AwaitRejoin.
	Await          string `json:"await,omitempty"`
	TimeoutSeconds int    `json:"timeoutSeconds"`
	Retry          Retry  `json:"retry"`
}

// Timeout is the step's timeout as a duration.
func (s Step) Timeout() time.Duration { return time.Duration(s.TimeoutSeconds) * time.Second }

// Arg is one argument an action takes.
type Arg struct {
	Name     string
	Required bool
	Summary  string
}

// Action is one kind of step.
type Action struct {
	On      Runner
	Name    string
	Summary string
	Args    []Arg
	// Destructive: the action changes the machine's disks, so an abort
	// once it started leaves the node failed, never back to ready.
	Destructive bool
	// EndsBoot: the action ends the agent's boot (a reboot); the step must
	// await rejoin, and no ramdisk step may follow it until another
	// boot-ramdisk.
	EndsBoot bool
	// Timeout and Retry are the defaults of a step that names none.
	Timeout time.Duration
	Retry   Retry
}

// Action names.
const (
	ActionSleep         = "sleep"
	ActionCheckImage    = "check-image"
	ActionAcceptance    = "acceptance"
	ActionStageImage    = "stage-image"
	ActionBootRamdisk   = "boot-ramdisk"
	ActionSetBootDevice = "set-boot-device"
	ActionPower         = "power"
	ActionWriteImage    = "write-image"
	ActionWriteSeed     = "write-seed"
	ActionWipeDisks     = "wipe-disks"
	ActionReboot        = "reboot"
	ActionExec          = "exec"
)

// Actions is the catalog: every (runner, action) a step may name.
var Actions = []Action{
	{On: RunnerControlPlane, Name: ActionSleep, Summary: "wait a number of seconds",
		Args: []Arg{{Name: "seconds", Required: true, Summary: "1 to 3600"}}, Timeout: time.Hour, Retry: Retry{MaxAttempts: 1}},
	{On: RunnerControlPlane, Name: ActionCheckImage,
		Summary: "the workflow's image is still available (and verified when the profile or pool requires it)",
		Timeout: time.Minute, Retry: Retry{MaxAttempts: 3, BackoffSeconds: 2}},
	{On: RunnerControlPlane, Name: ActionAcceptance,
		Summary: "the profile's acceptance checks hold on the node's latest inventory",
		Timeout: 5 * time.Minute, Retry: Retry{MaxAttempts: 1}},
	{On: RunnerSite, Name: ActionStageImage,
		Summary: "the site fetches the workflow's image from the control plane into its cache, checking its SHA-256, and serves it to the machine",
		Timeout: time.Hour, Retry: Retry{MaxAttempts: 3, BackoffSeconds: 5}},
	{On: RunnerSite, Name: ActionBootRamdisk, Summary: "boot the machine into the deploy ramdisk",
		Args:    []Arg{{Name: "via", Summary: "virtual-media or pxe (default: virtual-media where the bindings serve it)"}},
		Timeout: 15 * time.Minute, Retry: Retry{MaxAttempts: 2, BackoffSeconds: 10}},
	{On: RunnerSite, Name: ActionSetBootDevice, Summary: "set the machine's boot device through its BMC, read back",
		Args: []Arg{{Name: "device", Required: true, Summary: "disk, pxe or cd"},
			{Name: "persistent", Summary: "true (the default) or false: once"}},
		Timeout: 5 * time.Minute, Retry: Retry{MaxAttempts: 3, BackoffSeconds: 5}},
	{On: RunnerSite, Name: ActionPower, Summary: "a power action through the BMC, read back",
		Args:    []Arg{{Name: "action", Required: true, Summary: "on, off, cycle or reset"}},
		Timeout: 5 * time.Minute, Retry: Retry{MaxAttempts: 3, BackoffSeconds: 5}},
	{On: RunnerRamdisk, Name: ActionWriteImage,
		Summary:     "stream the staged image from the site to the root disk, checking its SHA-256 while writing",
		Args:        []Arg{{Name: "rootDevice", Summary: "a disk name (vda, nvme0n1) or serial; default: the smallest disk that holds the image"}},
		Destructive: true, Timeout: time.Hour, Retry: Retry{MaxAttempts: 2, BackoffSeconds: 5}},
	{On: RunnerRamdisk, Name: ActionWriteSeed,
		Summary:     "write the cloud-init NoCloud seed (user data, meta data, the agent's re-join config) as a CIDATA partition of the root disk",
		Destructive: true, Timeout: 5 * time.Minute, Retry: Retry{MaxAttempts: 3, BackoffSeconds: 5}},
	{On: RunnerRamdisk, Name: ActionWipeDisks, Summary: "wipe every disk's partition tables and signatures",
		Destructive: true, Timeout: 30 * time.Minute, Retry: Retry{MaxAttempts: 2, BackoffSeconds: 5}},
	{On: RunnerRamdisk, Name: ActionReboot, Summary: "reboot the machine out of the ramdisk",
		EndsBoot: true, Timeout: 15 * time.Minute, Retry: Retry{MaxAttempts: 1}},
	{On: RunnerRamdisk, Name: ActionExec, Summary: "run a program in the ramdisk (no shell)",
		Args: []Arg{{Name: "argv", Required: true, Summary: "the program and its arguments"},
			{Name: "timeoutSeconds", Summary: "1 to 3600"}},
		Timeout: 30 * time.Minute, Retry: Retry{MaxAttempts: 1}},
	{On: RunnerNode, Name: ActionExec, Summary: "an exec command to the node's agent (no shell), awaited",
		Args: []Arg{{Name: "argv", Required: true, Summary: "the program and its arguments"},
			{Name: "timeoutSeconds", Summary: "1 to 3600"}, {Name: "env", Summary: "variables added to the agent's"}},
		Timeout: 30 * time.Minute, Retry: Retry{MaxAttempts: 1}},
}

// ActionOf is the catalog's entry for (on, name).
func ActionOf(on Runner, name string) (Action, bool) {
	i := slices.IndexFunc(Actions, func(a Action) bool { return a.On == on && a.Name == name })
	if i < 0 {
		return Action{}, false
	}
	return Actions[i], true
}

// DefaultMetalSteps are the steps of a metal profile that names none:
// stage the image first (a tampered image fails here, before anything
// boots), boot the ramdisk, write the image and the seed, boot from disk,
// and wait for the installed system's agent.
func DefaultMetalSteps() []Step {
	steps := []Step{
		{Name: "check-image", On: RunnerControlPlane, Action: ActionCheckImage},
		{Name: "stage-image", On: RunnerSite, Action: ActionStageImage},
		{Name: "boot-ramdisk", On: RunnerSite, Action: ActionBootRamdisk},
		{Name: "write-image", On: RunnerRamdisk, Action: ActionWriteImage},
		{Name: "write-seed", On: RunnerRamdisk, Action: ActionWriteSeed},
		{Name: "boot-from-disk", On: RunnerSite, Action: ActionSetBootDevice, Args: map[string]any{"device": "disk", "persistent": true}},
		{Name: "reboot", On: RunnerRamdisk, Action: ActionReboot, Await: AwaitRejoin},
	}
	for i := range steps {
		steps[i] = WithDefaults(steps[i])
	}
	return steps
}

// WithDefaults fills a step's timeout and retry policy from its action
// where the step names none.
func WithDefaults(s Step) Step {
	a, ok := ActionOf(s.On, s.Action)
	if !ok {
		return s
	}
	if s.TimeoutSeconds == 0 {
		s.TimeoutSeconds = int(a.Timeout / time.Second)
	}
	if s.Retry.MaxAttempts == 0 {
		s.Retry = a.Retry
	}
	return s
}

// Workflow states.
const (
	WorkflowPending   = "pending"
	WorkflowRunning   = "running"
	WorkflowPaused    = "paused"
	WorkflowSucceeded = "succeeded"
	WorkflowFailed    = "failed"
	WorkflowAborted   = "aborted"
)

// Live says whether a workflow in state may still run a step (a profile
// it runs cannot be deleted).
func Live(state string) bool {
	return state == WorkflowPending || state == WorkflowRunning || state == WorkflowPaused
}

// Step states.
const (
	StepPending   = "pending"
	StepRunning   = "running"
	StepSucceeded = "succeeded"
	StepFailed    = "failed"
	StepAborted   = "aborted"
)

// ImageRef is the image a workflow writes, pinned when it was made.
type ImageRef struct {
	ID        string `json:"id"`
	TenantID  string `json:"tenantId"`
	Name      string `json:"name"`
	Version   string `json:"version"`
	Format    string `json:"format"`
	SHA256    string `json:"sha256"`
	SizeBytes int64  `json:"sizeBytes"`
	Verified  bool   `json:"verified"`
}

// RootDevice hints pick the disk an image is written to (Ironic's root
// device hints): every hint given must match; none picks the smallest disk
// that holds the image.
type RootDevice struct {
	Name       string `json:"name,omitempty"`
	Serial     string `json:"serial,omitempty"`
	MinSizeGiB int    `json:"minSizeGiB,omitempty"`
}

// Check is one acceptance check on the node once it re-joined.
type Check struct {
	// Kind is one of the Check* kinds; Value its threshold or value.
	Kind  string `json:"kind"`
	Value any    `json:"value,omitempty"`
}

// Acceptance check kinds.
const (
	CheckMinMemoryGiB = "minMemoryGiB"
	CheckMinCPUs      = "minCpus"
	CheckGPUCount     = "gpuCount"
	CheckGPUModel     = "gpuModel"
	CheckMinDisks     = "minDisks"
)

// Context is what every step of one workflow shares, rendered for its
// target when the workflow was made. UserData is inline cloud-init user
// data (not a secret); UserDataSecret a secret:// reference, resolved only
// when the ramdisk fetches the seed, so no value is in a row or a history.
type Context struct {
	ProfileID      string    `json:"profileId"`
	ProfileVersion int       `json:"profileVersion"`
	Target         string    `json:"target"`
	Image          *ImageRef `json:"image,omitempty"`
	// RequireVerified: the profile or the pool admits verified images
	// only (check-image checks it again at run time).
	RequireVerified bool              `json:"requireVerified,omitempty"`
	UserData        string            `json:"userData,omitempty"`
	UserDataSecret  string            `json:"userDataSecret,omitempty"`
	Hostname        string            `json:"hostname,omitempty"`
	MetaData        map[string]string `json:"metaData,omitempty"`
	RootDevice      *RootDevice       `json:"rootDevice,omitempty"`
	Acceptance      []Check           `json:"acceptance,omitempty"`
}
