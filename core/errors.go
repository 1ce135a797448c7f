package core

import (
	"errors"
	"fmt"
	"net/http"
)

// Code is one of the error codes of the API contract. Every error a caller
// sees carries exactly one of these.
type Code string

const (
	CodeInvalidInput  Code = "INVALID_INPUT"
	CodeUnauthn       Code = "UNAUTHENTICATED"
	CodeAccessDenied  Code = "ACCESS_DENIED"
	CodeNotFound      Code = "NOT_FOUND"
	CodeConflict      Code = "CONFLICT"
	CodeInvalidState  Code = "INVALID_STATE"
	CodeUnsupported   Code = "UNSUPPORTED"
	CodeQuotaExceeded Code = "QUOTA_EXCEEDED"
	CodeUnavailable   Code = "UNAVAILABLE"
	CodeInternal      Code = "INTERNAL_ERROR"
	CodeInvalidConfig Code = "INVALID_CONFIG"
)

// HTTPStatus maps a code to the status the HTTP API answers with.
func (c Code) HTTPStatus() int {
	switch c {
	case CodeInvalidInput:
		return http.StatusBadRequest
	case CodeUnauthn:
		return http.StatusUnauthorized
	case CodeAccessDenied:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeConflict, CodeInvalidState:
		return http.StatusConflict
	case CodeUnsupported:
		return http.StatusUnprocessableEntity
	case CodeQuotaExceeded:
		return http.StatusTooManyRequests
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// Error is an error with a contract code, a message safe to show the caller
// and optional structured details.
type Error struct {
	Code    Code           `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
	// cause is kept for logs and errors.Is/As; it is never sent to callers.
	cause error
}

func (e *Error) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.cause)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.cause }

// Is makes errors.Is(err, core.ErrNotFound) match any error of that code.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code && t.Message == "" && t.cause == nil && t.Details == nil
	}
	return false
}

// Sentinels for errors.Is: they match every error of their code.
var (
	ErrInvalidInput  = &Error{Code: CodeInvalidInput}
	ErrUnauthn       = &Error{Code: CodeUnauthn}
	ErrAccessDenied  = &Error{Code: CodeAccessDenied}
	ErrNotFound      = &Error{Code: CodeNotFound}
	ErrConflict      = &Error{Code: CodeConflict}
	ErrInvalidState  = &Error{Code: CodeInvalidState}
	ErrUnsupported   = &Error{Code: CodeUnsupported}
	ErrQuotaExceeded = &Error{Code: CodeQuotaExceeded}
	ErrUnavailable   = &Error{Code: CodeUnavailable}
	ErrInternal      = &Error{Code: CodeInternal}
	ErrInvalidConfig = &Error{Code: CodeInvalidConfig}
)

// Errorf builds an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap builds an *Error that keeps cause for logs but shows only message.
func Wrap(code Code, cause error, message string) *Error {
	return &Error{Code: code, Message: message, cause: cause}
}

// WithDetails returns a copy of e with details added.
func (e *Error) WithDetails(kv map[string]any) *Error {
	c := *e
	c.Details = make(map[string]any, len(e.Details)+len(kv))
	for k, v := range e.Details {
		c.Details[k] = v
	}
	for k, v := range kv {
		c.Details[k] = v
	}
	return &c
}

// AsError turns any error into an *Error: errors without a code become an
// opaque INTERNAL_ERROR, so internals never reach a caller.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return Wrap(CodeInternal, err, "internal error")
}
