package httpx

import (
	"net/http"
	"time"
)

// Defaults for Timeouts: every listener of the process (the API, the agent
// listener, the IAM host) bounds how long a client may take to send a
// request, so a client that trickles a body cannot hold a connection.
const (
	// DefaultReadHeaderTimeout bounds the request line and headers (and the
	// TLS handshake on a TLS listener).
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultReadTimeout bounds the whole request, headers and body: a
	// body of MaxBody bytes needs a client slower than 35 KB/s to miss it.
	// A handler serving a long-lived stream clears its own read deadline
	// (http.ResponseController.SetReadDeadline) once it has checked the
	// caller, as the agent session does.
	DefaultReadTimeout = 30 * time.Second
	// DefaultIdleTimeout bounds how long a kept-alive connection waits for
	// its next request.
	DefaultIdleTimeout = 2 * time.Minute
)

// Timeouts bound what a client may hold of a listener. Zero (or negative)
// fields take the defaults.
type Timeouts struct {
	ReadHeader time.Duration // DefaultReadHeaderTimeout
	Read       time.Duration // DefaultReadTimeout
	Idle       time.Duration // DefaultIdleTimeout
}

// WithDefaults fills t's zero fields.
func (t Timeouts) WithDefaults() Timeouts {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&t.ReadHeader, DefaultReadHeaderTimeout)
	def(&t.Read, DefaultReadTimeout)
	def(&t.Idle, DefaultIdleTimeout)
	return t
}

// NewServer is an http.Server for h bounded by t (defaults for its zero
// fields). It sets no write timeout: answers are bounded by what produces
// them (the database's and IAM's own timeouts), and a stream's writes by
// its handler.
func NewServer(h http.Handler, t Timeouts) *http.Server {
	t = t.WithDefaults()
	return &http.Server{Handler: h, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, IdleTimeout: t.Idle}
}
