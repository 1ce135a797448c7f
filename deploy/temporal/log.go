package temporal

import (
	"context"
	"fmt"
	"log/slog"
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

// Fatal logs and panics instead of exiting the process: an embedded server
// must not call os.Exit behind its host's back, and callers of Fatal do not
// expect it to return.
func (l serverLogger) Fatal(msg string, tags ...tag.Tag) {
	l.emit(slog.LevelError, msg, tags)
	panic(fmt.Sprintf("temporal server fatal error: %s", msg))
}
