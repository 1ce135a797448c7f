package api

import (
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
	ctxRequestID    = "bc.requestId"
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

// accessLog writes one structured line per request. It never logs headers or
// bodies, which may carry credentials.
func accessLog(m *metrics) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
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
		logger(c).Log(c.Request.Context(), level, "request",
			"method", c.Request.Method, "path", c.Request.URL.Path, "status", status,
			"durationMs", float64(elapsed.Microseconds())/1000, "remote", c.ClientIP())
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
