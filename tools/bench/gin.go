package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/api/reservations"
)

// ginScenario measures the yardstick get is held to: a bare gin JSON
// handler of get's shape (the same route and input, answering one of the
// run's reservations as the API answered it), in this process with the
// API's settings (release mode, the engine's context fallback, httpx's
// http.Server), called by the same client code with as many clients. What
// the API does beyond it (authentication, the decision, the database, the
// envelope) is what get's "ratio gin tps" measures.
func ginScenario(ctx context.Context, t *target, cfg config, prof *profiler, progress func(string, ...any)) (result, error) {
	res := result{Scenario: "gin", Clients: cfg.clients}
	if err := ensureReservations(ctx, t, 1, cfg.clients, progress); err != nil {
		return res, err
	}
	ids := t.reservations()
	answer, err := reservations.Get.Call(ctx, t.user, reservations.ReservationInput{TenantID: t.tenant, ReservationID: ids[0]})
	if err != nil {
		return res, fmt.Errorf("capture a reservation: %w", err)
	}
	srv, url, err := serveGin(answer)
	if err != nil {
		return res, err
	}
	defer srv.Close()
	client := httpClient(url, t.user.Token, cfg.clients)
	prof.begin(res.Scenario)
	run := drive(ctx, cfg.clients, cfg.duration, cfg.requests, func(ctx context.Context, _ int) error {
		_, err := reservations.Get.Call(ctx, client, reservations.ReservationInput{TenantID: t.tenant, ReservationID: ids[rand.IntN(len(ids))]})
		return err
	}, nil)
	prof.end()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.fill(run)
	res.Note = "bare gin handler answering reservation " + answer.ID
	return res, nil
}

// serveGin serves answer to every POST /api/compute/:group/:method whose
// body is a get input, on a loopback port, and returns the server and its
// URL.
func serveGin(answer reservations.Reservation) (*http.Server, string, error) {
	gin.SetMode(gin.ReleaseMode) // as api.New does
	e := gin.New()
	e.ContextWithFallback = true
	e.POST("/api/compute/:group/:method", func(c *gin.Context) {
		var in reservations.ReservationInput
		if err := c.ShouldBindJSON(&in); err != nil || in.ReservationID == "" {
			c.JSON(http.StatusBadRequest, gin.H{"error": gin.H{"code": "INVALID_INPUT", "message": "not a get input"}})
			return
		}
		c.JSON(http.StatusOK, answer)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := httpx.NewServer(e, httpx.Timeouts{})
	// Serve ends with ErrServerClosed at Close; any other end shows as the
	// calls' errors.
	go func() { _ = srv.Serve(ln) }()
	return srv, "http://" + ln.Addr().String(), nil
}
