package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The API's units: durations in seconds (fields named duration or ending
// in Seconds) and times in epoch milliseconds (start, end, from, to,
// notBefore, notAfter and fields ending in At). The CLI reads both the
// way people write them and renders times as RFC 3339 in tables.

// isSecondsField says whether an integer field holds a duration in seconds.
func isSecondsField(name string) bool {
	return name == "duration" || strings.HasSuffix(name, "Seconds")
}

// timeFields are the integer fields holding epoch milliseconds besides
// those ending in At.
var timeFields = map[string]bool{"start": true, "end": true, "from": true, "to": true, "notBefore": true, "notAfter": true}

// isTimeField says whether a field holds a time in epoch milliseconds.
func isTimeField(name string) bool {
	return timeFields[name] || (strings.HasSuffix(name, "At") && len(name) > 2)
}

// ParseDuration reads a duration as Go writes it (1h, 90m, 3600s, 1h30m),
// with d for days (2d, 1d12h); a bare number is seconds.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	if s == "" {
		return 0, fmt.Errorf("empty duration: want e.g. 1h, 90m, 3600s or 2d")
	}
	var days int64
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.ParseInt(s[:i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("duration %q: want e.g. 1h, 90m, 3600s or 2d", s)
		}
		days, s = n, s[i+1:]
	}
	var rest time.Duration
	if s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("duration %q: want e.g. 1h, 90m, 3600s or 2d", s)
		}
		rest = d
	}
	return time.Duration(days)*24*time.Hour + rest, nil
}

// parseSeconds reads a duration and answers it in whole seconds.
func parseSeconds(s string) (int64, error) {
	d, err := ParseDuration(s)
	if err != nil {
		return 0, err
	}
	if d%time.Second != 0 {
		return 0, fmt.Errorf("duration %q: the API counts whole seconds", s)
	}
	return int64(d / time.Second), nil
}

// ParseTime reads a time as RFC 3339, now, now plus or minus a duration
// (+1h, -30m, now+2d), or epoch milliseconds, and answers epoch ms.
func ParseTime(s string, now time.Time) (int64, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	}
	rel := strings.TrimPrefix(s, "now")
	if rel == "" {
		return now.UnixMilli(), nil
	}
	if rel[0] == '+' || rel[0] == '-' {
		d, err := ParseDuration(rel[1:])
		if err != nil {
			return 0, fmt.Errorf("time %q: %w", s, err)
		}
		if rel[0] == '-' {
			d = -d
		}
		return now.Add(d).UnixMilli(), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, fmt.Errorf("time %q: want RFC 3339 (2026-12-01T15:00:00Z), now, +1h or epoch milliseconds", s)
	}
	return t.UnixMilli(), nil
}

// FormatMillis renders epoch milliseconds as RFC 3339 in UTC.
func FormatMillis(ms int64) string {
	t := time.UnixMilli(ms).UTC()
	if ms%1000 == 0 {
		return t.Format(time.RFC3339)
	}
	return t.Format("2006-01-02T15:04:05.000Z07:00")
}
