package protocol

import (
	"slices"
	"testing"
)

// The kinds and states list their values for the schemas of inputs that
// take them.
func TestCommandEnums(t *testing.T) {
	if got := CommandKind("").Enum(); !slices.Equal(got, []string{"exec", "cdi.expose", "cdi.withdraw", "inventory.refresh", "reboot"}) {
		t.Fatalf("kinds = %v", got)
	}
	if got := CommandState("").Enum(); !slices.Equal(got, []string{"queued", "delivered", "running", "succeeded", "failed", "skipped", "cancelled", "expired"}) {
		t.Fatalf("states = %v", got)
	}
}
