package core

import (
	"errors"
	"net/http"
	"testing"
)

func TestIDs(t *testing.T) {
	id := NewID("pool")
	if !ValidID("pool", id) || len(id) != len("pool_")+26 {
		t.Fatalf("generated id %q is not valid", id)
	}
	d := DerivedID("rsv", "acme", "idn_1", "key-1")
	if !ValidID("rsv", d) || len(d) != len("rsv_")+52 {
		t.Fatalf("derived id %q is not valid", d)
	}
	if d != DerivedID("rsv", "acme", "idn_1", "key-1") {
		t.Fatal("derived id is not stable")
	}
	if d == DerivedID("rsv", "acme", "idn_1k", "ey-1") {
		t.Fatal("derived ids of different parts collide")
	}
	for _, bad := range []string{"pool_", "pool_ABCDEFGHJKMNPQRSTVWXYZ0123", "pol_01hzyx0000000000000000000a", "pool_01hzyx000000000000000000i0"} {
		if ValidID("pool", bad) {
			t.Errorf("ValidID(%q) = true", bad)
		}
	}
}

func TestErrorCodes(t *testing.T) {
	cases := []struct {
		code   Code
		status int
	}{
		{CodeInvalidInput, http.StatusBadRequest},
		{CodeUnauthn, http.StatusUnauthorized},
		{CodeAccessDenied, http.StatusForbidden},
		{CodeNotFound, http.StatusNotFound},
		{CodeConflict, http.StatusConflict},
		{CodeInvalidState, http.StatusConflict},
		{CodeUnsupported, http.StatusUnprocessableEntity},
		{CodeQuotaExceeded, http.StatusTooManyRequests},
		{CodeUnavailable, http.StatusServiceUnavailable},
		{CodeInternal, http.StatusInternalServerError},
	}
	for _, c := range cases {
		if got := c.code.HTTPStatus(); got != c.status {
			t.Errorf("%s: status %d, want %d", c.code, got, c.status)
		}
	}
	err := Errorf(CodeNotFound, "pool %s not found", "pool_x")
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) {
		t.Fatal("errors.Is does not match by code")
	}
	cause := errors.New("connection refused")
	wrapped := AsError(cause)
	if wrapped.Code != CodeInternal || wrapped.Message != "internal error" || !errors.Is(wrapped, cause) {
		t.Fatalf("AsError(plain) = %+v", wrapped)
	}
}
