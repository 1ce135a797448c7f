package secrets_test

import (
	"strings"
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/secrets"
)

func TestParseRef(t *testing.T) {
	tenant, name, err := secrets.ParseRef("secret://ten_a.b:c/bmc-rack1.node_7")
	if err != nil || tenant != "ten_a.b:c" || name != "bmc-rack1.node_7" {
		t.Fatalf("ParseRef = %q, %q, %v", tenant, name, err)
	}
	if got := secrets.Ref(tenant, name); got != "secret://ten_a.b:c/bmc-rack1.node_7" {
		t.Fatalf("Ref = %q", got)
	}
	for _, bad := range []string{
		"", "secret://", "secret://t", "secret://t/", "secret:///n", "Secret://t/n", "vault://t/n",
		"secret://t/N", "secret://t/-n", "secret://t/n-", "secret://t/n/m", "secret://t/n ", "secret://t t/n",
		"secret://t/" + strings.Repeat("a", secrets.MaxNameLength+1), "secret://" + strings.Repeat("t", 129) + "/n",
	} {
		_, _, err := secrets.ParseRef(bad)
		if core.AsError(err).Code != core.CodeInvalidInput {
			t.Errorf("ParseRef(%q) = %v, want INVALID_INPUT", bad, err)
		}
		if len(bad) > len(secrets.Scheme) && strings.Contains(err.Error(), bad) {
			t.Errorf("ParseRef(%q)'s error echoes the input: %v", bad, err)
		}
	}
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"a", "0", "ab", "a.b_c-d", strings.Repeat("a", secrets.MaxNameLength)} {
		if !secrets.ValidName(ok) {
			t.Errorf("ValidName(%q) = false", ok)
		}
	}
	for _, bad := range []string{"", ".a", "a.", "A", "a/b", "a b", "é", strings.Repeat("a", secrets.MaxNameLength+1)} {
		if secrets.ValidName(bad) {
			t.Errorf("ValidName(%q) = true", bad)
		}
	}
}
