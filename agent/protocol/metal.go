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
