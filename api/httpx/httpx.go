// Package httpx is what the API's HTTP surfaces share: the one error shape
// and bounded body reads, so the call envelope and the agent gateway answer
// alike.
package httpx

import (
	"errors"
	"io"
	"log/slog"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/better-compute/better-compute/core"
)

// MaxBody bounds a request's JSON body.
const MaxBody = 1 << 20

// Gin context keys the API's middleware sets and WriteError and the access
// log read.
const (
	// LoggerKey is the request's logger (set by the request-id middleware).
	LoggerKey = "bc.logger"
	// RequestIDKey is the request's id (X-Request-Id, read or made).
	RequestIDKey = "bc.requestId"
	// ErrorCodeKey is the contract code WriteError answered with, so the
	// access log names it without reading the body.
	ErrorCodeKey = "bc.errorCode"
)

// ErrorBody is the one error shape of the API:
// {"error":{"code":"INVALID_INPUT","message":"…","details":{…}},"requestId":"req_…"}.
// The request id is the X-Request-Id the answer also carries, so a caller
// who kept only the body can still quote it to an operator.
type ErrorBody struct {
	Error     *core.Error `json:"error"`
	RequestID string      `json:"requestId,omitempty"`
}

// Logger is the request's logger, or the default one.
func Logger(c *gin.Context) *slog.Logger {
	if l, ok := c.Get(LoggerKey); ok {
		return l.(*slog.Logger)
	}
	return slog.Default()
}

// WriteError answers with err's contract code and status. Errors without a
// code become an opaque INTERNAL_ERROR; their cause goes to the log only.
func WriteError(c *gin.Context, err error) {
	e := core.AsError(err)
	if e.Code == core.CodeInternal {
		Logger(c).Error("internal error", "error", err.Error())
	}
	c.Set(ErrorCodeKey, string(e.Code))
	c.AbortWithStatusJSON(e.Code.HTTPStatus(), ErrorBody{Error: e, RequestID: c.GetString(RequestIDKey)})
}

// ReadBody reads the request's body, at most MaxBody bytes.
func ReadBody(c *gin.Context) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, MaxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, core.Errorf(core.CodeInvalidInput, "request body is larger than %d bytes", MaxBody)
	case err != nil:
		return nil, core.Errorf(core.CodeInvalidInput, "could not read the request body")
	}
	return body, nil
}
