package drivers

import "strings"

// NormalisePower maps what a BMC says of its power to the node's power
// axis. IPMI answers a sentence ("Chassis Power is on\n"), Redfish a
// PowerState enum ("On", "PoweringOn", "Off", "PoweringOff"); a state in
// transition counts as the state it is heading to, because the read-back
// that follows a write waits for that one. Anything else is unknown, never
// a guess.
func NormalisePower(s string) PowerState {
	v := strings.ToLower(strings.TrimSpace(s))
	v = strings.TrimPrefix(v, "chassis power is ")
	v = strings.TrimPrefix(v, "system power is ")
	switch v {
	case "on", "poweringon", "powering on":
		return PowerOn
	case "off", "poweringoff", "powering off":
		return PowerOff
	}
	return PowerUnknown
}
