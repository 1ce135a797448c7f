package temporal

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/log/tag"
)

// serverLogger forwards the Temporal server's logs to an slog.Logger,
// dropping everything below minLevel before the tags are rendered (the
// server logs a lot at Info and rendering its tags is not free). Once
// stopping is set, only errors pass: a shutdown makes the internal clients
// and system workers warn about every connection the shutdown closes.
type serverLogger struct {
	out      *slog.Logger
	minLevel slog.Leveler
	stopping *atomic.Bool
}

var _ log.Logger = serverLogger{}

func (l serverLogger) emit(level slog.Level, msg string, tags []tag.Tag) {
	if level < l.minLevel.Level() || (level < slog.LevelError && l.stopping.Load()) ||
		!l.out.Enabled(context.Background(), level) {
		return
	}
	attrs := make([]slog.Attr, 0, len(tags))
	for _, t := range tags {
		attrs = append(attrs, slog.Any(t.Key(), t.Value()))
	}
	l.out.LogAttrs(context.Background(), level, msg, attrs...)
}

func (l serverLogger) Debug(msg string, tags ...tag.Tag) { l.emit(slog.LevelDebug, msg, tags) }
func (l serverLogger) Info(msg string, tags ...tag.Tag)  { l.emit(slog.LevelInfo, msg, tags) }
func (l serverLogger) Warn(msg string, tags ...tag.Tag)  { l.emit(slog.LevelWarn, msg, tags) }
func (l serverLogger) Error(msg string, tags ...tag.Tag) { l.emit(slog.LevelError, msg, tags) }

// DPanic only panics in development builds of zap; here it is an error log.
func (l serverLogger) DPanic(msg string, tags ...tag.Tag) { l.emit(slog.LevelError, msg, tags) }

// Panic logs and panics, as the server expects.
func (l serverLogger) Panic(msg string, tags ...tag.Tag) {
	l.emit(slog.LevelError, msg, tags)
	panic(msg)
}

// Fatal logs and panics with a fatalError instead of exiting the process:
// an embedded server must not call os.Exit behind its host's back, and
// callers of Fatal do not expect it to return. Start turns the panics
// raised while it builds and starts the server into errors.
func (l serverLogger) Fatal(msg string, tags ...tag.Tag) {
	l.emit(slog.LevelError, msg, tags)
	panic(fatalError{msg: msg, tags: tags})
}

type fatalError struct {
	msg  string
	tags []tag.Tag
}

func (e fatalError) Error() string {
	var b strings.Builder
	b.WriteString("temporal server fatal error: ")
	b.WriteString(e.msg)
	for _, t := range e.tags {
		fmt.Fprintf(&b, " %s=%v", t.Key(), t.Value())
	}
	return b.String()
}

// catchFatal runs f, turning a fatalError panic on this goroutine into an
// error. Other panics go on.
func catchFatal(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(fatalError)
			if !ok {
				panic(r)
			}
			err = fe
		}
	}()
	return f()
}
