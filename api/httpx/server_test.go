package httpx

import (
	"net/http"
	"testing"
	"time"
)

func TestNewServerBoundsEveryRead(t *testing.T) {
	h := http.NotFoundHandler()
	s := NewServer(h, Timeouts{})
	if s.ReadHeaderTimeout != DefaultReadHeaderTimeout || s.ReadTimeout != DefaultReadTimeout || s.IdleTimeout != DefaultIdleTimeout {
		t.Fatalf("defaults: header %v, read %v, idle %v", s.ReadHeaderTimeout, s.ReadTimeout, s.IdleTimeout)
	}
	s = NewServer(h, Timeouts{ReadHeader: time.Second, Read: 2 * time.Second, Idle: 3 * time.Second})
	if s.ReadHeaderTimeout != time.Second || s.ReadTimeout != 2*time.Second || s.IdleTimeout != 3*time.Second {
		t.Fatalf("configured: header %v, read %v, idle %v", s.ReadHeaderTimeout, s.ReadTimeout, s.IdleTimeout)
	}
}
