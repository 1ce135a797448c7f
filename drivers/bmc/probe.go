package bmc

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/better-compute/better-compute/drivers"
)

// getChannelAuthCaps is an RMCP datagram carrying an IPMI 1.5 Get Channel
// Authentication Capabilities request (channel: this one, IPMI v2.0
// extensions, administrator level): the first thing any IPMI client
// sends, needing no session, so every BMC answers it.
var getChannelAuthCaps = []byte{
	0x06, 0x00, 0xff, 0x07, // RMCP: version 1, no ack, class IPMI
	0x00, 0, 0, 0, 0, 0, 0, 0, 0, // session: no auth, sequence 0, id 0
	0x09,             // message length
	0x20, 0x18, 0xc8, // BMC address, NetFn App, checksum
	0x81, 0x00, 0x38, // remote console, sequence, command
	0x8e, 0x04, 0xb5, // channel 0xe with v2.0 bit, admin, checksum
}

// probeIPMI tells, within timeout, whether anything answers IPMI at addr.
// ipmitool retries an address that never answers for about a minute;
// without the probe an absent BMC would take that long to report.
func probeIPMI(ctx context.Context, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", drivers.ErrUnreachable, addr, err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	buf := make([]byte, 512)
	// UDP may drop the request: resend it a few times within the timeout.
	for tries := 0; ; tries++ {
		if _, err := conn.Write(getChannelAuthCaps); err != nil {
			return fmt.Errorf("%w: %s: %w", drivers.ErrUnreachable, addr, err)
		}
		_ = conn.SetReadDeadline(minTime(deadline, time.Now().Add(timeout/4)))
		n, err := conn.Read(buf)
		if err == nil && n >= 4 && buf[0] == 0x06 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err == nil {
				err = fmt.Errorf("not an RMCP answer")
			}
			return fmt.Errorf("%w: no IPMI answer from %s within %s: %w", drivers.ErrUnreachable, addr, timeout, err)
		}
		if ne, ok := err.(net.Error); err != nil && !(ok && ne.Timeout()) {
			// ICMP port unreachable surfaces as a read error: nothing listens.
			return fmt.Errorf("%w: %s: %w", drivers.ErrUnreachable, addr, err)
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
