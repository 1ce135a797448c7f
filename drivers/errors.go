package drivers

import (
	"errors"
	"fmt"
)

// ErrTransient marks a failure worth retrying as is: a 503 or 429 from a
// busy BMC, a read that timed out on a connection that was open. Drivers
// wrap a protocol error with it; Retry retries it with backoff, and once
// the retries are spent the Registry fails over as for ErrUnreachable.
var ErrTransient = errors.New("the BMC failed transiently")

// wrapf wraps sentinel with the BMC's own message, so that errors.Is finds
// the sentinel and the operator reads what the BMC said.
func wrapf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}

// Wrap returns err marked as sentinel (one of the Err* values), keeping
// err's message and chain. A nil err stays nil.
func Wrap(sentinel, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sentinel) {
		return err
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}

// Unavailable reports whether err says the driver could not reach or use
// the BMC at all (not that the BMC refused or ignored the request): the
// errors on which a machine with two protocols fails over to the other.
func Unavailable(err error) bool {
	return errors.Is(err, ErrUnreachable) || errors.Is(err, ErrTransient) || errors.Is(err, ErrUnsupported)
}
