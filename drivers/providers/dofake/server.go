package dofake

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// Server is a Fake listening on a port of its own, for processes (the dev
// stack, cmd/do-fake) rather than tests (which can mount a Fake on
// httptest).
type Server struct {
	*Fake
	// URL is the base URL to give godo's SetBaseURL ("http://127.0.0.1:port").
	URL  string
	srv  *http.Server
	done chan error
	once sync.Once
}

// Start serves a new Fake of cfg on addr ("127.0.0.1:0": a free port).
func Start(addr string, cfg Config) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	f := New(cfg)
	s := &Server{
		Fake: f,
		URL:  "http://" + ln.Addr().String(),
		srv:  &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second},
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Close stops the server, waiting at most for ctx for requests in flight.
func (s *Server) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		err = s.srv.Shutdown(ctx)
		if serveErr := <-s.done; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
			err = errors.Join(err, serveErr)
		}
	})
	return err
}
