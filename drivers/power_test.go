package drivers

import "testing"

func TestNormalisePower(t *testing.T) {
	for _, c := range []struct {
		in   string
		want PowerState
	}{
		{"Chassis Power is off\n", PowerOff},
		{"Chassis Power is on\n", PowerOn},
		{"Chassis Power is on", PowerOn},
		{"On", PowerOn},
		{"Off", PowerOff},
		{"PoweringOn", PowerOn},
		{"PoweringOff", PowerOff},
		{"on", PowerOn},
		{" OFF ", PowerOff},
		{"Paused", PowerUnknown},
		{"", PowerUnknown},
		{"Chassis Power is unknown", PowerUnknown},
		{"Error: Unable to establish IPMI v2 / RMCP+ session", PowerUnknown},
	} {
		if got := NormalisePower(c.in); got != c.want {
			t.Errorf("NormalisePower(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
