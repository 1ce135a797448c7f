package api

import (
	"context"
	"log/slog"
	"regexp"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/better-compute/better-compute/api/httpx"

	"github.com/better-compute/better-compute/core"
)

const (
	requestIDHeader = "X-Request-Id"
	ctxRequestID    = httpx.RequestIDKey
	ctxLogger       = httpx.LoggerKey
)

// A caller-supplied request id is kept only when it is short and plain, so it
// can go into logs and audit rows as it is.
var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// requestID takes the caller's X-Request-Id when it is well formed, or makes
// one, and echoes it on the response.
func requestID(base *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		id := c.GetHeader(requestIDHeader)
		if !requestIDPattern.MatchString(id) {
			id = core.NewID("req")
		}
		c.Set(ctxRequestID, id)
		c.Set(ctxLogger, base.With("requestId", id))
		c.Header(requestIDHeader, id)
		c.Next()
	}
}

// callRecord is what the envelope learned of an HTTP call, for its access
// log line: the envelope fills it in (Server.Call), the middleware that put
// it in the request's context writes it out.
type callRecord struct {
	method, code, tenant, identity string
}

type callRecordKey struct{}

// recordOf is the request's call record, or nil outside an HTTP request.
func recordOf(ctx context.Context) *callRecord {
	r, _ := ctx.Value(callRecordKey{}).(*callRecord)
	return r
}

// accessLog writes one structured line per request: what was asked (method,
// path, the API method), by whom (tenant, identity) and how it ended (status,
// error code). It never logs headers or bodies, which may carry credentials.
func accessLog(m *metrics) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		rec := &callRecord{}
		c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), callRecordKey{}, rec))
		c.Next()
		elapsed := time.Since(start)
		route := c.FullPath()
		if route == "" {
			route = "unmatched"
		}
		status := c.Writer.Status()
		m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
		m.latency.WithLabelValues(route).Observe(elapsed.Seconds())
		level := slog.LevelInfo
		if status >= 500 {
			level = slog.LevelError
		}
		code := rec.code
		if code == "" {
			code = c.GetString(httpx.ErrorCodeKey)
		}
		if code == "" {
			code = "OK"
		}
		attrs := []any{"method", c.Request.Method, "path", c.Request.URL.Path, "status", status, "code", code,
			"durationMs", float64(elapsed.Microseconds()) / 1000, "remote", c.ClientIP()}
		if rec.method != "" {
			attrs = append(attrs, "apiMethod", rec.method)
		}
		if rec.tenant != "" {
			attrs = append(attrs, "tenantId", rec.tenant)
		}
		if rec.identity != "" {
			attrs = append(attrs, "identityId", rec.identity)
		}
		logger(c).Log(c.Request.Context(), level, "request", attrs...)
	}
}

// recovery turns a panic in a handler into an opaque INTERNAL_ERROR.
func recovery() gin.HandlerFunc {
	return func(c *gin.Context) {
		defer func() {
			if p := recover(); p != nil {
				logger(c).Error("panic in handler", "panic", p)
				writeError(c, core.Errorf(core.CodeInternal, "internal error"))
			}
		}()
		c.Next()
	}
}

func logger(c *gin.Context) *slog.Logger { return httpx.Logger(c) }

func requestIDOf(c *gin.Context) string { return c.GetString(ctxRequestID) }
