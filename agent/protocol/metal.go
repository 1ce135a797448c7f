package protocol

import "encoding/json"

// Paths of the bare-metal endpoints on the API listener. The site endpoints
// authenticate with the site token and the fencing epoch of the boot lease
// the agent holds (only the serving agent may use them); the ramdisk
// endpoints with a boot token (one boot of one node) or a site's discovery
// token.
const (
	// SiteBMCCredentialsPath answers a node's BMC credentials, resolved from
	// their secret references just before use, to the agent of the node's
	// site only.
	SiteBMCCredentialsPath = "/agent/v1/site/bmc-credentials"
	// SiteBootTokenPath mints the one-time token of one boot (a
	// metal_boots row of a node of the agent's site), once.
	SiteBootTokenPath = "/agent/v1/site/boot-token"
	// SiteDiscoveryTokenPath answers the site's discovery token, which
	// the discovery ramdisk of machines nobody enrolled reports with.
	SiteDiscoveryTokenPath = "/agent/v1/site/discovery-token"

	// RamdiskReportPath: the ramdisk's inventory, once it booted; answers
	// the steps to run.
	RamdiskReportPath = "/agent/v1/ramdisk/report"
	// RamdiskResultPath: the results of the steps.
	RamdiskResultPath = "/agent/v1/ramdisk/result"
	// RamdiskDiscoverPath: a machine that booted the site's discovery
	// ramdisk without being enrolled.
	RamdiskDiscoverPath = "/agent/v1/ramdisk/discover"
)

// Token prefixes of the metal tokens (the API stores their SHA-256 only).
const (
	BootTokenPrefix      = "bcbt_"
	DiscoveryTokenPrefix = "bcdt_"
)

// SiteAuth is what every site endpoint's body starts with.
type SiteAuth struct {
	Token string `json:"token"`
	Epoch int64  `json:"epoch"`
}

// SiteBMCCredentialsRequest asks for one node's BMC credentials.
type SiteBMCCredentialsRequest struct {
	SiteAuth
	NodeID string `json:"nodeId"`
}

// BMCCredentials is one protocol's resolved credentials.
type BMCCredentials struct {
	Address            string `json:"address"`
	Username           string `json:"username"`
	Password           string `json:"password"`
	CAPEM              string `json:"caPem,omitempty"`
	InsecureSkipVerify bool   `json:"insecureSkipVerify,omitempty"`
}

// SiteBMCCredentialsResult answers SiteBMCCredentialsPath: the node's
// endpoints (nil when the node has none for a protocol).
type SiteBMCCredentialsResult struct {
	NodeID  string          `json:"nodeId"`
	Redfish *BMCCredentials `json:"redfish,omitempty"`
	IPMI    *BMCCredentials `json:"ipmi,omitempty"`
}

// SiteBootTokenRequest asks for the token of one boot.
type SiteBootTokenRequest struct {
	SiteAuth
	BootID string `json:"bootId"`
}

// SiteBootTokenResult answers SiteBootTokenPath. APIURL is where the
// ramdisk reports (the API as the site's machines reach it).
type SiteBootTokenResult struct {
	BootID    string `json:"bootId"`
	NodeID    string `json:"nodeId"`
	Purpose   string `json:"purpose"`
	Token     string `json:"token"`
	ExpiresAt int64  `json:"expiresAt"`
}

// SiteDiscoveryTokenResult answers SiteDiscoveryTokenPath.
type SiteDiscoveryTokenResult struct {
	SiteID string `json:"siteId"`
	Token  string `json:"token"`
}

// RamdiskBootConfig is what a booted ramdisk reads (from the file
// RamdiskBootConfigPath in its initramfs, or from the site's boot server):
// where to report, and as whom.
type RamdiskBootConfig struct {
	APIURL string `json:"apiUrl"`
	// Token is a boot token (bcbt_…) or, for the discovery ramdisk, the
	// site's discovery token (bcdt_…).
	Token   string `json:"token"`
	BootID  string `json:"bootId,omitempty"`
	Purpose string `json:"purpose"`
	// AgentEndpoint is the agent listener as the site's machines reach it
	// (`bcd site --machine-agent-endpoint`; "" means the one the join
	// answers): a deploy writes it into the seed's SeedJoin.
	AgentEndpoint string `json:"agentEndpoint,omitempty"`
}

// RamdiskBootConfigPath is where the ramdisk's boot configuration lies in
// the initramfs.
const RamdiskBootConfigPath = "/etc/bcd/boot.json"

// RamdiskReport is the body of POST RamdiskReportPath.
type RamdiskReport struct {
	Token     string          `json:"token"`
	Inventory json.RawMessage `json:"inventory"`
}

// RamdiskStep is one step the ramdisk runs: "wipe-disks" (zero every
// disk's partition tables and signatures), "power-off", "wait" (stay up,
// e.g. rescue).
type RamdiskStep struct {
	Name string            `json:"name"`
	Args map[string]string `json:"args,omitempty"`
}

// The ramdisk steps.
const (
	StepWipeDisks = "wipe-disks"
	StepPowerOff  = "power-off"
	StepWait      = "wait"
)

// RamdiskInstructions answers a report (and a result): the steps to run
// next, none when there is nothing more to do.
type RamdiskInstructions struct {
	NodeID string        `json:"nodeId"`
	Steps  []RamdiskStep `json:"steps"`
	// PollMs, when set, is how often a waiting ramdisk reports again
	// (a deploy's workflow hands it one step at a time).
	PollMs int64 `json:"pollMs,omitempty"`
}

// RamdiskStepResult is one step's outcome.
type RamdiskStepResult struct {
	Name       string `json:"name"`
	OK         bool   `json:"ok"`
	Message    string `json:"message,omitempty"`
	DurationMs int64  `json:"durationMs"`
}

// RamdiskResult is the body of POST RamdiskResultPath.
type RamdiskResult struct {
	Token   string              `json:"token"`
	Results []RamdiskStepResult `json:"results"`
}

// RamdiskDiscover is the body of POST RamdiskDiscoverPath.
type RamdiskDiscover struct {
	Token     string          `json:"token"`
	BootMAC   string          `json:"bootMac"`
	Inventory json.RawMessage `json:"inventory"`
}

// Provisioning (Bare metal II): the image a site stages, the seed a
// ramdisk writes, and how the installed system's agent re-joins.
const (
	// SiteImagePathPrefix + imageId + "?node=" + nodeId: GET an image's
	// bytes for a workflow in flight on that node of the agent's site
	// (honouring Range, so an interrupted fetch resumes). The site
	// authenticates with the headers SiteTokenHeader and SiteEpochHeader.
	SiteImagePathPrefix = "/agent/v1/site/images/"
	SiteTokenHeader     = "Authorization" // "Bearer <site token>"
	SiteEpochHeader     = "Bc-Site-Epoch"

	// RamdiskSeedPath: the ramdisk of a deploy boot asks for the NoCloud
	// seed of the workflow in flight (POST RamdiskSeedRequest, answers
	// RamdiskSeed). User data held as a secret is resolved here, just
	// before use; a secret that is gone answers NOT_FOUND, reason
	// secretNotFound, and the write-seed step fails with that message.
	RamdiskSeedPath = "/agent/v1/ramdisk/seed"
)

// The deploy steps of the ramdisk (args are strings; a list or an object
// is its JSON).
const (
	// StepWriteImage streams args "url" (the site's boot server, which
	// takes the boot token as a bearer) to the disk chosen by the hints
	// "rootDevice" (a name or serial) and "minSizeBytes", checking
	// "sha256" and "sizeBytes" while writing; a mismatch fails the step
	// and leaves the disk's first MiB zeroed, so nothing boots from it.
	StepWriteImage = "write-image"
	// StepWriteSeed writes the NoCloud seed (RamdiskSeed, and
	// SeedJoinFile) as a FAT partition labelled SeedLabel in the free
	// space after the written image's partitions (args "rootDevice" as
	// write-image's; the disk write-image wrote when left out).
	StepWriteSeed = "write-seed"
	// StepReboot posts its result, then reboots the machine.
	StepReboot = "reboot"
	// StepExec runs args "argv" (a JSON list) with "timeoutSeconds".
	StepExec = "exec"
)

// RamdiskSeedRequest is the body of POST RamdiskSeedPath.
type RamdiskSeedRequest struct {
	Token string `json:"token"`
}

// RamdiskSeed answers RamdiskSeedPath: the NoCloud files' contents.
type RamdiskSeed struct {
	NodeID     string `json:"nodeId"`
	WorkflowID string `json:"workflowId"`
	// MetaData is the meta-data file (YAML: instance-id, local-hostname).
	MetaData string `json:"metaData"`
	// UserData is the user-data file ("" writes none).
	UserData string `json:"userData,omitempty"`
	// NetworkConfig is the network-config file ("" writes none).
	NetworkConfig string `json:"networkConfig,omitempty"`
}

// The NoCloud seed as the ramdisk writes it and the installed system
// reads it.
const (
	// SeedLabel is the seed filesystem's label (cloud-init's NoCloud).
	SeedLabel = "CIDATA"
	// SeedJoinFile is the seed's file of bcd's re-join config (SeedJoin).
	SeedJoinFile = "bcd/join.json"
)

// SeedJoin is how the installed system's agent re-joins: `bcd node join`
// with the deploy boot's token (a boot token joins only the boot's node,
// with its hardware key, once, without approval), then `bcd node run`
// against AgentEndpoint when set (the agent listener as the site's
// machines reach it), else the endpoint the join answers.
type SeedJoin struct {
	APIURL        string `json:"apiUrl"`
	Token         string `json:"token"`
	NodeID        string `json:"nodeId"`
	AgentEndpoint string `json:"agentEndpoint,omitempty"`
}
